package ledger

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/token"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// batchCheck decodes a batch's tokens and checks their signatures on
// every core while the handler books them, one chunk ahead of it: checking
// is about half of a booking's CPU and parallel, booking is serial, and
// run one after the other each left a core idle (bench/wallet-notes.md).
type batchCheck struct {
	index  map[*kgo.Record]int
	toks   []checkedToken
	chunks []chan struct{} // closed when the chunk's tokens are checked
	wg     sync.WaitGroup
}

// checkedToken is a token of the batch as the handler gets it: decoded
// once, its signature checked.
type checkedToken struct {
	tok     *pb.Token
	verdict error
}

// checkChunk is how far ahead of the handler checking starts.
const checkChunk = 256

// checkBatch starts checking recs in chunks, in order.
func (l *Ledger) checkBatch(recs []*kgo.Record) *batchCheck {
	c := &batchCheck{index: make(map[*kgo.Record]int, len(recs)), toks: make([]checkedToken, len(recs)),
		chunks: make([]chan struct{}, (len(recs)+checkChunk-1)/checkChunk)}
	for i, r := range recs {
		c.index[r] = i
	}
	for i := range c.chunks {
		c.chunks[i] = make(chan struct{})
	}
	var next atomic.Int64
	for range runtime.GOMAXPROCS(0) {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for {
				n := int(next.Add(1) - 1)
				if n >= len(c.chunks) {
					return
				}
				for i := n * checkChunk; i < min((n+1)*checkChunk, len(recs)); i++ {
					if streams.HasSchema(recs[i], withdrawalSchema) {
						continue
					}
					tok := new(pb.Token)
					if decodeToken(recs[i], tok) == nil && tok.Status == pb.TokenStatus_PROCESSING {
						c.toks[i] = checkedToken{tok, l.cfg.Keys.Verify(tok)}
					}
				}
				close(c.chunks[n])
			}
		}()
	}
	return c
}

var tokenSchema = schemas.Of(&pb.Token{})

// decodeToken is streams.Decode for tokens, through token.Unmarshal. A
// record it refuses is left to the handler, which decodes it again and
// dead-letters it with streams.Decode's reason.
func decodeToken(r *kgo.Record, tok *pb.Token) error {
	if err := streams.CheckSchema(r, tokenSchema); err != nil {
		return err
	}
	return token.Unmarshal(r.Value, tok)
}

// token returns r's token once it is checked; false for a record that is
// not a pending token (the handler decodes it itself).
func (c *batchCheck) token(r *kgo.Record) (checkedToken, bool) {
	if c == nil {
		return checkedToken{}, false
	}
	i, ok := c.index[r]
	if !ok {
		return checkedToken{}, false
	}
	<-c.chunks[i/checkChunk]
	return c.toks[i], c.toks[i].tok != nil
}

// wait returns once every chunk is checked (the batch is over).
func (c *batchCheck) wait() {
	if c != nil {
		c.wg.Wait()
	}
}
