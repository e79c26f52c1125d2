package grant

// Validation: a grant against the activity tree and its own fields.

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"surge/processors/wallet/config"
	"surge/processors/wallet/internal/guard"
	"surge/processors/wallet/order"
	pb "surge/schemas/surgev1"
)

func (in *Intake) validate(ctx context.Context, tree *config.Tree, g *pb.RewardGrant, now time.Time) (*pending, error) {
	if !in.local.Allow(1) {
		_, err := in.refuse("rate_limited", fmt.Errorf("%w: instance limit %d/s", ErrRateLimited, tree.RateLimits.GrantsPerInstance))
		return nil, err
	}
	l := &in.live
	if g.Shadow {
		l = &in.shadow
	}
	if lim := tree.RateLimits.GrantsGlobal; lim > 0 && !tree.Degraded(guard.GlobalLimit) {
		ok, err := in.global.Allow(ctx, l.keys+"grants", lim, 1)
		if err == nil && !ok {
			_, err := in.refuse("rate_limited", fmt.Errorf("%w: global limit %d/s", ErrRateLimited, lim))
			return nil, err
		}
	}
	bad := func(kind string, err error) (*pending, error) { _, err = in.refuse(kind, err); return nil, err }
	if g.AtMs == 0 {
		g.AtMs = now.UnixMilli()
	}
	// The caller's at_ms picks the phase: checked against this clock, so a
	// caller cannot grant into a phase that closed long ago or is not open.
	if err := tree.AcceptsGrantAt(time.UnixMilli(g.AtMs), now); err != nil {
		return bad("invalid", fmt.Errorf("%w: %v", ErrInvalid, err))
	}
	if err := order.Check(g); err != nil {
		return bad("invalid", fmt.Errorf("%w: %v", ErrInvalid, err))
	}
	if field, ok := validText(g); !ok {
		// Protobuf strings are UTF-8, and the record is encoded by hand
		// (token.MarshalWithGrant): a consumer would refuse it later.
		return bad("invalid", fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, field))
	}
	if g.Amount <= 0 {
		return bad("invalid", fmt.Errorf("%w: amount %d must be positive", ErrInvalid, g.Amount))
	}
	parent := g.ParentActivityId
	if parent == "" {
		parent = g.ActivityId
	}
	phase, scene, err := tree.Resolve(parent, g.SceneId, time.UnixMilli(g.AtMs))
	if err != nil {
		return bad("invalid", fmt.Errorf("%w: %v", ErrInvalid, err))
	}
	award, _ := config.Award(scene.Award)
	if award != g.AwardType {
		return bad("invalid", fmt.Errorf("%w: scene %s grants %s, not %s", ErrInvalid, scene.ID, scene.Award, g.AwardType))
	}
	if g.Amount > scene.MaxAmount {
		return bad("over_cap", fmt.Errorf("%w: %d > %d", ErrOverCap, g.Amount, scene.MaxAmount))
	}
	g.ParentActivityId, g.ActivityId, g.TemplateId = parent, phase.ID, scene.Template
	return &pending{g: g, l: l, phase: phase, scene: scene}, nil
}

// validText reports whether the grant's text fields are UTF-8, and if not
// which one is not.
func validText(g *pb.RewardGrant) (string, bool) {
	for _, f := range [...]struct{ name, v string }{{"order_no", g.OrderNo}, {"act_id", g.ActId}, {"activity_id", g.ActivityId},
		{"scene_id", g.SceneId}, {"rain_id", g.RainId}, {"app_id", g.AppId}, {"template_id", g.TemplateId}, {"parent_activity_id", g.ParentActivityId}} {
		if !utf8.ValidString(f.v) {
			return f.name, false
		}
	}
	return "", true
}
