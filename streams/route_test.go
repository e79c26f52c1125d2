package streams_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Route sends each record to its topic's input, decoded; dead-letters
// what does not decode and what no input takes; and refuses, when built,
// inputs that are not exactly the spec's.
func TestRouteDispatchesByDeclaredInput(t *testing.T) {
	spec := streams.Spec{Name: "p", Inputs: []string{"push.login", "push.units.*"}}
	var logins, units []string
	login := streams.On("push.login", func(_ context.Context, _ *kgo.Record, ev *pb.LoginEvent, _ *streams.Output) error {
		logins = append(logins, fmt.Sprint(ev.Uin))
		return nil
	})
	unit := streams.OnRecord("push.units.*", func(_ context.Context, in *kgo.Record, _ *streams.Output) error {
		units = append(units, in.Topic)
		return nil
	})
	route, err := streams.Route(spec, "ns.", login, unit)
	if err != nil {
		t.Fatal(err)
	}
	ctx, out := context.Background(), &streams.Output{}
	good, err := streams.NewRecord("ns.push.login", []byte("u1"), &pb.LoginEvent{Uin: 7, Online: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := route(ctx, good, out); err != nil || len(logins) != 1 || logins[0] != "7" {
		t.Fatalf("a login: %v, handled %v", err, logins)
	}
	if err := route(ctx, &kgo.Record{Topic: "ns.push.units.e7", Value: []byte("x")}, out); err != nil || len(units) != 1 || units[0] != "ns.push.units.e7" {
		t.Fatalf("a family member: %v, handled %v", err, units)
	}
	wrongSchema, _ := streams.NewRecord("ns.push.login", nil, &pb.Token{ActId: "a"})
	garbage := &kgo.Record{Topic: "ns.push.login", Value: []byte{0xff, 0xff, 0xff}}
	for name, r := range map[string]*kgo.Record{
		"another schema on the topic": wrongSchema,
		"bytes that do not decode":    garbage,
		"a topic no input declares":   {Topic: "ns.push.jobs", Value: []byte("x")},
		"another namespace's login":   {Topic: "other.push.login", Value: good.Value, Headers: good.Headers},
		"the family's bare prefix":    {Topic: "ns.push.units", Value: []byte("x")},
	} {
		if err := route(ctx, r, out); !streams.IsReject(err) {
			t.Errorf("%s: %v, want it dead-lettered (a RejectError)", name, err)
		}
	}
	if len(logins) != 1 || len(units) != 1 {
		t.Errorf("refused records reached a handler: logins %v, units %v", logins, units)
	}

	for name, c := range map[string]struct {
		inputs []streams.Input
		want   string
	}{
		"an input without a handler": {[]streams.Input{login}, `declares input "push.units.*" and has no handler`},
		"a handler of no input":      {[]streams.Input{login, unit, streams.OnRecord("push.jobs", nil)}, `handles "push.jobs", which its spec does not declare`},
		"an input handled twice":     {[]streams.Input{login, unit, login}, `handles "push.login" twice`},
	} {
		if _, err := streams.Route(spec, "ns.", c.inputs...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}
