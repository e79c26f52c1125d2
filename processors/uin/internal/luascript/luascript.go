// Package luascript runs pipelines of Redis script calls by SHA, loading
// the script when the server does not have it.
package luascript

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Pipelined runs send, which queues calls of s by SHA (EvalSha) in a
// pipeline and executes it. A server that does not know s (a fresh or
// restarted one, a flushed script cache) answers NOSCRIPT and runs none of
// them: s is loaded and send runs once more. Every script call in send's
// pipeline must be of s.
func Pipelined(ctx context.Context, rdb redis.Scripter, s *redis.Script, send func() error) error {
	err := send()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			return err
		}
		err = send()
	}
	return err
}
