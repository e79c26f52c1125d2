package allocation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"surge/streams/httperr"
	"time"
)

// Client is the allocation API for a registration service: Allocate asks
// for one uin. Callers that ask while a call is on the wire are served
// together by the next call (POST /v1/uins?count=N, N the number
// waiting, at most MaxCount), the way a Kafka producer batches records:
// one caller alone goes out at once, and under load one round trip
// serves many. The client holds no uins of its own, so "never twice" and
// "nothing stranded" stay with the pool service: a uin is allocated only
// when a caller is waiting for it.
type Client struct {
	url, auth string
	hc        *http.Client
	waiting   chan *clientCall
	slots     chan struct{} // calls allowed on the wire at once
}

type clientCall struct {
	ctx  context.Context
	done chan clientResult
}

type clientResult struct {
	uin uint32
	err error
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// InFlight is how many calls may be on the wire at once (default 2: on
// the measured 2-core machine two gave the best rate and tail, see
// bench/alloc.txt).
func InFlight(n int) ClientOption {
	return func(c *Client) { c.slots = make(chan struct{}, max(n, 1)) }
}

// HTTPClient replaces the default HTTP client.
func HTTPClient(hc *http.Client) ClientOption { return func(c *Client) { c.hc = hc } }

// NewClient returns a client of the pool service at base (http://host:port)
// calling with the API key.
func NewClient(base, key string, opts ...ClientOption) *Client {
	c := &Client{url: strings.TrimSuffix(base, "/") + "/v1/uins?count=", auth: "Bearer " + key,
		waiting: make(chan *clientCall, 4*MaxCount), slots: make(chan struct{}, 2)}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		n := cap(c.slots)
		c.hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: n}}
	}
	return c
}

// Allocate returns a new uin, never handed out before. ErrPoolDry says the
// pool has none left right now (retry later).
func (c *Client) Allocate(ctx context.Context) (uint32, error) {
	call := &clientCall{ctx: ctx, done: make(chan clientResult, 1)}
	select {
	case c.waiting <- call:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	select {
	case c.slots <- struct{}{}:
		// This caller sends a call for itself and everyone waiting.
		go c.send()
	default:
		// A call is out on every slot; the first to come back sends.
	}
	select {
	case r := <-call.done:
		return r.uin, r.err
	case <-ctx.Done():
		// The call may still get a uin for us: it is then lost to the
		// pool, as when a caller gives up on a single call.
		return 0, ctx.Err()
	}
}

// ErrPoolDry is the service's 503 for an exhausted pool.
var ErrPoolDry = errors.New("uin pool exhausted")

// send holds a slot: it takes every waiting caller (up to MaxCount), makes
// one call for them all, and repeats while callers wait, then frees the
// slot.
func (c *Client) send() {
	for {
		batch := c.takeWaiting()
		if len(batch) == 0 {
			<-c.slots
			// A caller may have queued after takeWaiting and found every
			// slot taken: look once more now that one is free.
			if len(c.waiting) > 0 {
				select {
				case c.slots <- struct{}{}:
					continue
				default:
				}
			}
			return
		}
		uins, err := c.call(batch)
		for i, call := range batch {
			switch {
			case i < len(uins):
				call.done <- clientResult{uin: uins[i]}
			case err != nil:
				call.done <- clientResult{err: err}
			default:
				call.done <- clientResult{err: ErrPoolDry}
			}
		}
	}
}

func (c *Client) takeWaiting() []*clientCall {
	var batch []*clientCall
	for len(batch) < MaxCount {
		select {
		case call := <-c.waiting:
			if call.ctx.Err() != nil {
				call.done <- clientResult{err: call.ctx.Err()}
				continue
			}
			batch = append(batch, call)
		default:
			return batch
		}
	}
	return batch
}

// call allocates len(batch) uins in one request. It does not take a
// caller's context: one caller giving up must not fail the others.
func (c *Client) call(batch []*clientCall) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+strconv.Itoa(len(batch)), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", c.auth)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusServiceUnavailable:
		var refusal httperr.Body
		if json.Unmarshal(body, &refusal) == nil && refusal.Code == httperr.Exhausted {
			return nil, ErrPoolDry
		}
		fallthrough
	default:
		return nil, fmt.Errorf("uin-pool: %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	var out struct {
		Uins []uint32 `json:"uins"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("uin-pool: bad answer: %w", err)
	}
	return out.Uins, nil
}
