// Package config is the wallet's activity tree, read from a file and
// reloaded when the file changes: parent activities map to child
// activities by time window (internal test, gray release, official), so the
// phases never share budget or grants; each scene has one reward type, a
// per-grant cap and its switches. Degrade switches and rate limits live in
// the same file, so an operator flips them without a restart.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"

	pb "surge/schemas/surgev1"
)

// Phase is a child activity's stage.
type Phase string

const (
	PhaseTest     Phase = "test"
	PhaseGray     Phase = "gray"
	PhaseOfficial Phase = "official"
)

// Child is one phase of a parent activity.
type Child struct {
	ID     string    `mapstructure:"id"`
	Phase  Phase     `mapstructure:"phase"`
	Start  time.Time `mapstructure:"start"`
	End    time.Time `mapstructure:"end"`
	Budget int64     `mapstructure:"budget"` // cents this phase may grant in total
}

// Switches of a scene.
type Switches struct {
	Compensation   bool `mapstructure:"compensation"`
	RateLimit      bool `mapstructure:"rate_limit"`
	StockControl   bool `mapstructure:"stock_control"`
	Reconciliation bool `mapstructure:"reconciliation"`
}

// Scene is one reward type within an activity.
type Scene struct {
	ID        string   `mapstructure:"id"`
	Award     string   `mapstructure:"award"` // cash, coupon, pendant
	MaxAmount int64    `mapstructure:"max_amount"`
	Template  string   `mapstructure:"template"` // coupon template
	Stock     int64    `mapstructure:"stock"`    // coupon stock of the template
	Switches  Switches `mapstructure:"switches"`
}

// Activity is a parent activity.
type Activity struct {
	ID       string  `mapstructure:"id"`
	Children []Child `mapstructure:"children"`
	Scenes   []Scene `mapstructure:"scenes"`
}

// Tree is the whole file.
type Tree struct {
	Activities []Activity      `mapstructure:"activities"`
	Degrade    map[string]bool `mapstructure:"degrade"` // switch name -> degraded (off)
	RateLimits struct {
		GrantsPerInstance int `mapstructure:"grants_per_instance"` // per second; 0 = unlimited
		GrantsGlobal      int `mapstructure:"grants_global"`       // per second over all instances
		// GrantsPerApp is grants per second per instance for each app
		// ("*": any app not named); 0 or absent = unlimited. Answered 429
		// before the grants cost Redis or Kafka anything.
		GrantsPerApp      map[string]int `mapstructure:"grants_per_app"`
		BookingsPerSecond int            `mapstructure:"bookings_per_second"` // the ledger's capacity
	} `mapstructure:"rate_limits"`
	// GrantLag is how far a grant's at_ms (when the user earned it, which
	// picks the phase) may lie behind the server's clock: a grant caught
	// just before its phase closed still lands in it, but nobody grants
	// into a phase closed long ago. 0 means DefaultGrantLag.
	GrantLag time.Duration `mapstructure:"grant_lag"`
}

// DefaultGrantLag covers a request's delay and a client's retries after
// a crash; a retry later than that is refused, not answered as a duplicate.
const DefaultGrantLag = 10 * time.Minute

// GrantLead is how far a grant's at_ms may lie ahead of the server's
// clock (the callers' clocks are not exact).
const GrantLead = time.Minute

// AcceptsGrantAt reports whether a grant earned at at may be accepted now.
func (t *Tree) AcceptsGrantAt(at, now time.Time) error {
	lag := t.GrantLag
	if lag <= 0 {
		lag = DefaultGrantLag
	}
	switch {
	case at.Before(now.Add(-lag)):
		return fmt.Errorf("at_ms %s is more than %s before the server's time %s", at.UTC().Format(time.RFC3339), lag, now.UTC().Format(time.RFC3339))
	case at.After(now.Add(GrantLead)):
		return fmt.Errorf("at_ms %s is more than %s after the server's time %s", at.UTC().Format(time.RFC3339), GrantLead, now.UTC().Format(time.RFC3339))
	}
	return nil
}

// Award maps a scene's award name to the type.
func Award(s string) (pb.AwardType, error) {
	switch s {
	case "cash":
		return pb.AwardType_CASH, nil
	case "coupon":
		return pb.AwardType_COUPON, nil
	case "pendant":
		return pb.AwardType_PENDANT, nil
	}
	return 0, fmt.Errorf("unknown award type %q", s)
}

// Validate checks the tree: ids unique, windows ordered and not
// overlapping within a parent, every scene's award known.
func (t *Tree) Validate() error {
	if len(t.Activities) == 0 {
		return errors.New("no activities (an empty or half-written file?)")
	}
	seen := map[string]bool{}
	for _, a := range t.Activities {
		if a.ID == "" || seen[a.ID] {
			return fmt.Errorf("activity id %q empty or repeated", a.ID)
		}
		seen[a.ID] = true
		for i, c := range a.Children {
			if c.ID == "" || seen[c.ID] {
				return fmt.Errorf("activity %s: child id %q empty or repeated", a.ID, c.ID)
			}
			seen[c.ID] = true
			if !c.End.After(c.Start) {
				return fmt.Errorf("activity %s: child %s ends before it starts", a.ID, c.ID)
			}
			for _, d := range a.Children[:i] {
				if c.Start.Before(d.End) && d.Start.Before(c.End) {
					return fmt.Errorf("activity %s: phases %s and %s overlap", a.ID, d.ID, c.ID)
				}
			}
		}
		for _, s := range a.Scenes {
			if _, err := Award(s.Award); err != nil {
				return fmt.Errorf("activity %s scene %s: %w", a.ID, s.ID, err)
			}
			if s.MaxAmount <= 0 {
				return fmt.Errorf("activity %s scene %s: max_amount must be positive", a.ID, s.ID)
			}
		}
	}
	return nil
}

// Errors of Resolve: each refuses a grant.
var (
	ErrUnknownActivity = errors.New("unknown activity")
	ErrUnknownScene    = errors.New("unknown scene")
	ErrNoPhase         = errors.New("outside every phase window")
)

// Resolve finds the phase of parent activity at time at, and the scene.
func (t *Tree) Resolve(parent, scene string, at time.Time) (Child, Scene, error) {
	for _, a := range t.Activities {
		if a.ID != parent {
			continue
		}
		var sc *Scene
		for i := range a.Scenes {
			if a.Scenes[i].ID == scene {
				sc = &a.Scenes[i]
			}
		}
		if sc == nil {
			return Child{}, Scene{}, fmt.Errorf("%w %q in activity %s", ErrUnknownScene, scene, parent)
		}
		for _, c := range a.Children {
			if !at.Before(c.Start) && at.Before(c.End) {
				return c, *sc, nil
			}
		}
		return Child{}, Scene{}, fmt.Errorf("%w of activity %s at %s", ErrNoPhase, parent, at.UTC().Format(time.RFC3339))
	}
	return Child{}, Scene{}, fmt.Errorf("%w %q", ErrUnknownActivity, parent)
}

// Degraded reports whether a weak dependency is switched off.
func (t *Tree) Degraded(name string) bool { return t.Degrade[name] }

// Source holds the current tree and swaps it when the file changes; a
// file that fails to parse or validate is logged and the old tree kept.
type Source struct {
	cur atomic.Pointer[Tree]
	log *slog.Logger
	// Reloads counts accepted reloads.
	Reloads atomic.Int64
}

// Static wraps a fixed tree (tests, embedded mode).
func Static(t *Tree) *Source {
	s := &Source{log: slog.Default()}
	s.cur.Store(t)
	return s
}

// Load reads path (YAML, TOML or JSON) and watches it.
func Load(path string, log *slog.Logger) (*Source, error) {
	if log == nil {
		log = slog.Default()
	}
	v := viper.New()
	v.SetConfigFile(path)
	s := &Source{log: log}
	read := func() (*Tree, error) {
		if err := v.ReadInConfig(); err != nil {
			return nil, err
		}
		var t Tree
		// Times may be written quoted too ("2026-01-20T00:00:00Z"), as
		// JSON has them: a string is parsed as RFC 3339.
		hooks := viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(
			mapstructure.StringToTimeHookFunc(time.RFC3339), mapstructure.StringToTimeDurationHookFunc(), mapstructure.StringToSliceHookFunc(",")))
		if err := v.Unmarshal(&t, hooks); err != nil {
			return nil, err
		}
		return &t, t.Validate()
	}
	t, err := read()
	if err != nil {
		return nil, fmt.Errorf("wallet config %s: %w", path, err)
	}
	s.cur.Store(t)
	v.OnConfigChange(func(fsnotify.Event) {
		t, err := read()
		if err != nil {
			log.Error("wallet config: reload refused; keeping the previous tree", "file", path, "err", err)
			return
		}
		s.cur.Store(t)
		s.Reloads.Add(1)
		log.Info("wallet config reloaded", "file", path, "activities", len(t.Activities))
	})
	v.WatchConfig()
	return s, nil
}

// Tree returns the current tree.
func (s *Source) Tree() *Tree { return s.cur.Load() }

// Swap replaces the tree as a reload of the file would (tests, and a
// program embedding the wallet with its own configuration); a tree that
// does not validate is refused and the current one kept.
func (s *Source) Swap(t *Tree) error {
	if err := t.Validate(); err != nil {
		return err
	}
	s.cur.Store(t)
	s.Reloads.Add(1)
	return nil
}
