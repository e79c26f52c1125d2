package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"

	"surge/schemas"
)

// cmdSchemas: "schemas export" writes the FileDescriptorSet of every
// schema the topics carry, so standard tools decode them (protoc
// --decode, kcat piped into it, Kafka UIs that take a descriptor set);
// "schemas list" prints each topic's schema.
func cmdSchemas(_ context.Context, args []string) error {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		_, _ = io.WriteString(os.Stdout, schemasUsage)
		return nil
	}
	switch args[0] {
	case "export":
		var out string
		_, _, err := loadConfig("schemas export", args[1:], func(fs *pflag.FlagSet) {
			fs.StringVar(&out, "out", "", "file to write (empty: stdout)")
		})
		if err != nil {
			return err
		}
		set, err := schemas.DescriptorSet()
		if err != nil {
			return err
		}
		var w io.Writer = os.Stdout
		if out != "" {
			f, err := os.Create(out)
			if err != nil {
				return err
			}
			defer f.Close()
			w = f
		}
		_, err = w.Write(set)
		return err
	case "list":
		for _, t := range schemas.Topics {
			schema := t.Schema
			if schema == "" {
				schema = "(any: the failed record's own)"
			}
			fmt.Printf("%-32s %s\n", t.Name, schema)
		}
		return nil
	}
	return errors.New(`schemas takes "export [--out FILE]" or "list"`)
}

const schemasUsage = `usage: surge schemas export [--out FILE]   the FileDescriptorSet (binary) of every topic's schema
       surge schemas list                  each topic and the protobuf message its records carry

Decode a topic with kcat and protoc:
  surge schemas export --out surge.binpb
  kcat -b BROKER -C -t uin.usage -c 1 -e -f '%s' | protoc --decode surge.v1.UsageEvent --descriptor_set_in surge.binpb
`
