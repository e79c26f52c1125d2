// Package recovery rebuilds the remaining work of a push job from the
// topics alone: (package) minus (what the report topic says was delivered
// or filtered). It is how another data centre takes over a job whose
// executors are gone: the package store and push.reports are replicated,
// nothing else is needed.
package recovery

import (
	"context"
	"fmt"
	"surge/schemas/uinset"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Outcome is what the report topic says about one job.
type Outcome struct {
	Delivered *roaring.Bitmap // DELIVERED and DELIVERED_ON_LOGIN
	Filtered  *roaring.Bitmap
	Reports   int
	Duplicate uint64 // deliveries reported more than once (must stay 0)
}

// Read reads the job's reports from push.reports (namespaced by ns).
func Read(ctx context.Context, kc streams.Cluster, ns, jobID string) (*Outcome, error) {
	o := &Outcome{Delivered: roaring.New(), Filtered: roaring.New()}
	err := streams.ReadToEnd(ctx, kc, ns+schemas.TopicReports, func(r *kgo.Record) error {
		if string(r.Key) != jobID {
			return nil
		}
		var rep pb.DeliveryReport
		if err := streams.Decode(r, &rep); err != nil {
			return nil
		}
		set := roaring.New()
		if len(rep.Uins) > 0 {
			var err error
			if set, err = uinset.Decode(rep.Uins); err != nil {
				return fmt.Errorf("recovery: report with unreadable uins: %w", err)
			}
		} else {
			set.Add(uint32(rep.Uin))
		}
		o.Reports++
		switch rep.Status {
		case pb.DeliveryStatus_DELIVERED, pb.DeliveryStatus_DELIVERED_ON_LOGIN:
			o.Duplicate += o.Delivered.AndCardinality(set)
			o.Delivered.Or(set)
		case pb.DeliveryStatus_FILTERED:
			o.Filtered.Or(set)
		}
		return nil
	})
	return o, err
}

// Remaining is package minus delivered minus filtered: the targets another
// site still has to send to.
func Remaining(ctx context.Context, kc streams.Cluster, ns, jobID string, pkg *roaring.Bitmap) (*roaring.Bitmap, *Outcome, error) {
	o, err := Read(ctx, kc, ns, jobID)
	if err != nil {
		return nil, nil, err
	}
	rest := pkg.Clone()
	rest.AndNot(o.Delivered)
	rest.AndNot(o.Filtered)
	return rest, o, nil
}
