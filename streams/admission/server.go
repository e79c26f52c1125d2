package admission

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// Limits are a server's bounds on what one connection may hold.
type Limits struct {
	ReadHeader time.Duration // the headers must arrive within (default 5 s)
	Read       time.Duration // the whole request, body included (default 10 s)
	Write      time.Duration // the answer (default 30 s)
	Idle       time.Duration // a keep-alive connection's idle time (default 60 s)
	MaxConns   int           // open connections; more wait in the kernel's backlog (default 10,000)
	MaxHeader  int           // header bytes (default 64 KiB)
}

func (l *Limits) defaults() {
	if l.ReadHeader <= 0 {
		l.ReadHeader = 5 * time.Second
	}
	if l.Read <= 0 {
		l.Read = 10 * time.Second
	}
	if l.Write <= 0 {
		l.Write = 30 * time.Second
	}
	if l.Idle <= 0 {
		l.Idle = 60 * time.Second
	}
	if l.MaxConns <= 0 {
		l.MaxConns = 10_000
	}
	if l.MaxHeader <= 0 {
		l.MaxHeader = 64 << 10
	}
}

// Server is an http.Server for h with the limits' timeouts: a client that
// sends its body slowly, or stalls, or keeps a connection idle, holds it
// for a bounded time only.
func Server(h http.Handler, l Limits) *http.Server {
	l.defaults()
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeader, ReadTimeout: l.Read,
		WriteTimeout: l.Write, IdleTimeout: l.Idle, MaxHeaderBytes: l.MaxHeader}
}

// Serve listens on addr and serves srv on at most l.MaxConns connections
// until ctx ends, then shuts down gracefully (5 s for the requests in
// flight). ready, if not nil, is called with the bound address.
func Serve(ctx context.Context, addr string, srv *http.Server, l Limits, ready func(net.Addr)) error {
	l.defaults()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if ready != nil {
		ready(ln.Addr())
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	err = srv.Serve(LimitListener(ln, l))
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// LimitListener is ln accepting at most l.MaxConns connections at once.
func LimitListener(ln net.Listener, l Limits) net.Listener {
	l.defaults()
	return netutil.LimitListener(ln, l.MaxConns)
}
