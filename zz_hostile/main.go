package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
)

func main() {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:19092"), kgo.ProducerBatchMaxBytes(2<<20))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	ctx := context.Background()
	junk := func(n int) []byte { b := make([]byte, n); _, _ = rand.Read(b); return b }
	n := 0
	for _, t := range schemas.Topics {
		if len(os.Args) > 1 && !strings.Contains(os.Args[1], t.Name) {
			continue
		}
		hdr := func(ver string) []kgo.RecordHeader {
			return []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(t.Schema)}, {Key: schemas.HeaderVersion, Value: []byte(ver)}}
		}
		recs := []*kgo.Record{
			{Topic: t.Name, Key: []byte("k1"), Value: junk(64)},
			{Topic: t.Name, Key: []byte("k2"), Value: junk(64), Headers: hdr("1")},
			{Topic: t.Name, Key: []byte("k3"), Value: junk(16), Headers: hdr("99")},
			{Topic: t.Name, Key: nil, Value: junk(32), Headers: hdr("1")},
			{Topic: t.Name, Key: []byte("k5"), Value: []byte{}, Headers: hdr("1")},
			{Topic: t.Name, Key: []byte("k6"), Value: junk(900 << 10), Headers: hdr("1")},
			{Topic: t.Name, Key: []byte("\xff\xfe"), Value: []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, Headers: hdr("1")},
		}
		for _, r := range recs {
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				fmt.Println(t.Name, "produce:", err)
				continue
			}
			n++
		}
	}
	fmt.Println("hostile records:", n)
}
