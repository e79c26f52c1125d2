package schemas

import "testing"

func TestEveryTopicNamesARegisteredSchema(t *testing.T) {
	seen := map[string]bool{}
	for _, tp := range Topics {
		if seen[tp.Name] {
			t.Fatalf("topic %s registered twice", tp.Name)
		}
		seen[tp.Name] = true
		if tp.Partitions <= 0 {
			t.Errorf("%s: partitions %d", tp.Name, tp.Partitions)
		}
		if !tp.Compacted && tp.Retention <= 0 && tp.Retention != Forever {
			t.Errorf("%s: neither compacted nor retained", tp.Name)
		}
		if tp.Name == TopicDeadLetter {
			continue
		}
		if _, ok := Lookup(tp.Schema); !ok {
			t.Errorf("%s: schema %q not registered", tp.Name, tp.Schema)
		}
	}
}

func TestAcceptsVersionRange(t *testing.T) {
	s, ok := Lookup("surge.v1.LoginEvent")
	if !ok {
		t.Fatal("LoginEvent not registered")
	}
	if !s.Accepts(1) || s.Accepts(0) || s.Accepts(2) {
		t.Fatalf("version window wrong: %+v", s)
	}
}

func TestTopicByNameShadow(t *testing.T) {
	tp, err := TopicByName(ShadowPrefix + TopicGrants)
	if err != nil || tp.Name != "shadow.wallet.grants" || tp.Schema != "surge.v1.RewardGrant" {
		t.Fatalf("shadow lookup: %+v %v", tp, err)
	}
	if _, err := TopicByName("nope"); err == nil {
		t.Fatal("unknown topic accepted")
	}
}
