package grant

// Budget and stock: a phase's budget and a coupon template's stock taken
// for a batch, and given back for the grants that fail after.

import (
	"context"
	"errors"
	"fmt"

	"surge/processors/wallet/config"
	"surge/processors/wallet/internal/guard"
	"surge/processors/wallet/internal/stock"
	"surge/processors/wallet/internal/tally"
	pb "surge/schemas/surgev1"
)

// spendBudget takes the budget of a phase once for all its grants; if the
// sum does not fit, it takes grant by grant, so the grants that fit still
// pass. A budget counter that is missing (Redis lost it) refuses its
// grants with ErrRebuilding and has it rebuilt from the topics.
func (in *Intake) spendBudget(ctx context.Context, ps []*pending) []*pending {
	groups := map[string][]*pending{}
	for _, p := range ps {
		if p.phase.Budget > 0 {
			k := p.l.budgetKey(p.phase.ID)
			groups[k] = append(groups[k], p)
		}
	}
	failed := map[*pending]bool{}
	for key, group := range groups {
		var sum int64
		for _, p := range group {
			sum += p.g.Amount
		}
		budget := group[0].phase.Budget
		_, err := in.tally.Take(ctx, key, sum, budget)
		if err == nil {
			for _, p := range group {
				p.spent = true
			}
			continue
		}
		for _, p := range group { // slow path: one by one
			err := err
			if errors.Is(err, tally.ErrOver) {
				_, err = in.tally.Take(ctx, key, p.g.Amount, budget)
			}
			switch {
			case err == nil:
				p.spent = true
				continue
			case errors.Is(err, tally.ErrOver):
				_, e := in.refuse("over_budget", fmt.Errorf("%w: %s has less than %d of %d left", ErrOverBudget, p.phase.ID, p.g.Amount, budget))
				*p.out = Outcome{Err: e}
			case errors.Is(err, tally.ErrMissing):
				in.rebuild.trigger()
				_, e := in.refuse("rebuilding", fmt.Errorf("%w: budget of %s", ErrRebuilding, p.phase.ID))
				*p.out = Outcome{Err: e}
			default:
				*p.out = Outcome{Err: fmt.Errorf("grant: budget: %w", err)}
			}
			failed[p] = true
		}
	}
	return in.keep(ctx, ps, failed)
}

// keep drops the failed grants from ps and releases their claims.
func (in *Intake) keep(ctx context.Context, ps []*pending, failed map[*pending]bool) []*pending {
	if len(failed) == 0 {
		return ps
	}
	var ok, bad []*pending
	for _, p := range ps {
		if failed[p] {
			bad = append(bad, p)
		} else {
			ok = append(ok, p)
		}
	}
	in.undo(ctx, bad)
	return ok
}

func (in *Intake) takeStock(ctx context.Context, tree *config.Tree, ps []*pending) []*pending {
	failed := map[*pending]bool{}
	for _, p := range ps {
		if p.g.AwardType != pb.AwardType_COUPON || !p.scene.Switches.StockControl {
			continue
		}
		var err error
		if tree.Degraded(guard.Stock) {
			_, err = in.refuse("degraded", fmt.Errorf("%w: coupon stock", ErrDegraded))
		} else if err = p.l.stock.CheckStop(ctx, p.scene.Template, p.scene.Stock); err != nil {
			if errors.Is(err, stock.ErrLow) {
				in.mResult.With("stock_low").Inc()
			}
		} else if err = p.l.stock.Take(ctx, p.scene.Template, p.scene.Stock, p.g.Amount); err != nil && !errors.Is(err, tally.ErrMissing) {
			in.mResult.With("out_of_stock").Inc()
			if errors.Is(err, stock.ErrTimeout) {
				p.idem = "" // a timed-out take may have counted: keep the order number spent
			}
		}
		if errors.Is(err, tally.ErrMissing) {
			in.rebuild.trigger()
			_, err = in.refuse("rebuilding", fmt.Errorf("%w: stock of %s", ErrRebuilding, p.scene.Template))
		}
		if err != nil {
			*p.out = Outcome{Err: err}
			failed[p] = true
		}
	}
	return in.keep(ctx, ps, failed)
}
