package streams

import "errors"

// RejectError marks input that can never be processed: bad data, not a bad
// moment. The runtime dead-letters the record with Reason and moves on.
type RejectError struct {
	Reason string
	Err    error
	// Keep keeps what the handler emitted for the record (a processor that
	// publishes its own verdict, such as a REJECTED job state, beside the
	// dead letter); by default a rejected record emits nothing.
	Keep bool
}

func (e *RejectError) Error() string {
	if e.Err != nil {
		return e.Reason + ": " + e.Err.Error()
	}
	return e.Reason
}

func (e *RejectError) Unwrap() error { return e.Err }

// Reject returns a *RejectError; err may be nil.
func Reject(reason string, err error) error { return &RejectError{Reason: reason, Err: err} }

// RejectKeeping is Reject that keeps the record's outputs.
func RejectKeeping(reason string, err error) error {
	return &RejectError{Reason: reason, Err: err, Keep: true}
}

// IsReject reports whether err is (or wraps) a *RejectError.
func IsReject(err error) bool {
	var re *RejectError
	return errors.As(err, &re)
}
