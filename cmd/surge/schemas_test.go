package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"surge/schemas"
	pb "surge/schemas/surgev1"
)

// surge schemas export writes a descriptor set from which a tool that
// knows nothing of surge decodes every topic's records: each registry
// schema is in it, and a record value decoded through it (dynamicpb, and
// protoc --decode when protoc is installed) reads as the message sent.
func TestSchemasExportDecodesEveryTopic(t *testing.T) {
	out := filepath.Join(t.TempDir(), "surge.binpb")
	if _, stderr, err := command(t, nil, "schemas", "export", "--out", out); err != nil {
		t.Fatalf("schemas export: %v\n%s", err, stderr)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(raw, &set); err != nil {
		t.Fatalf("not a FileDescriptorSet: %v", err)
	}
	files, err := protodesc.NewFiles(&set) // fails if a dependency is missing
	if err != nil {
		t.Fatalf("the set does not stand alone: %v", err)
	}
	for _, tp := range schemas.Topics {
		if tp.Schema == "" {
			continue
		}
		if _, err := files.FindDescriptorByName(protoreflect.FullName(tp.Schema)); err != nil {
			t.Errorf("topic %s: schema %s not in the set: %v", tp.Name, tp.Schema, err)
		}
	}

	sent := &pb.UsageEvent{Uin: 30, Kind: "login", AtMs: 1_700_000_000_000, Source: "auth"}
	value, _ := proto.Marshal(sent)
	d, _ := files.FindDescriptorByName("surge.v1.UsageEvent")
	got := dynamicpb.NewMessage(d.(protoreflect.MessageDescriptor))
	if err := proto.Unmarshal(value, got); err != nil {
		t.Fatal(err)
	}
	if a, b := protojson.Format(got), protojson.Format(sent); a != b {
		t.Fatalf("decoded through the set: %s, sent %s", a, b)
	}
	if _, err := exec.LookPath("protoc"); err != nil {
		t.Log("protoc not installed: its decode not tried")
		return
	}
	cmd := exec.Command("protoc", "--decode", "surge.v1.UsageEvent", "--descriptor_set_in", out)
	cmd.Stdin = bytes.NewReader(value)
	text, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("protoc --decode: %v\n%s", err, text)
	}
	for _, want := range []string{"uin: 30", `kind: "login"`, `source: "auth"`} {
		if !strings.Contains(string(text), want) {
			t.Fatalf("protoc --decode printed %q, want %s in it", text, want)
		}
	}
}
