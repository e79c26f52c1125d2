package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// cmdProbe asks this container's own service whether it is ready
// (/readyz on metrics.addr) or alive (--live: /healthz): the Dockerfile's
// HEALTHCHECK and a scheduler's exec probe, in an image with no curl.
func cmdProbe(ctx context.Context, args []string) error {
	v, fs, err := loadConfig("probe", args, func(fs *pflag.FlagSet) {
		fs.Bool("live", false, "ask /healthz (the process answers) instead of /readyz")
	})
	if err != nil {
		return err
	}
	live, _ := fs.GetBool("live")
	addr := v.GetString("metrics.addr")
	if addr == "" {
		return fmt.Errorf("metrics.addr is empty: the service serves no /readyz to probe")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("metrics.addr %q: %w", addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1" // listening everywhere: ask it here
	}
	path := "/readyz"
	if live {
		path = "/healthz"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+net.JoinHostPort(host, port)+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("not answering: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("not ready (%d):\n%s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	fmt.Print(string(body))
	return nil
}
