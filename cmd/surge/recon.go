package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kadm"

	"surge/processors/uin/pool"
	"surge/processors/uin/uinkeys"
	"surge/sinks/clickhouse"
	"surge/sinks/recon"
	"surge/streams"
	"surge/streams/metrics"
)

// cmdRecon is the operator's reconciliation command.
func cmdRecon(ctx context.Context, args []string) error {
	var asJSON bool
	var hours int
	var hour string
	v, fs, err := loadConfig("recon", args, func(fs *pflag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "report: JSON instead of text")
		fs.IntVar(&hours, "hours", 24, "report: hours back to show")
		fs.StringVar(&hour, "hour", "", "run: the hour to reconcile (RFC 3339, e.g. 2026-12-02T10:00:00Z); default the last full hour")
	})
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("recon takes one of: report, run, serve")
	}
	log := newLogger(v)
	st, err := openStore(ctx, v, log)
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := clickhouse.Migrate(ctx, st); err != nil {
		return err
	}
	rc := recon.Config{Env: streams.Env{Log: log, Metrics: metrics.Default}, Store: st}
	var admin *kadm.Client
	if v.GetString("kafka.brokers") != "" {
		bs, err := needKafka(ctx, v)
		if err != nil {
			return err
		}
		cl, err := bs.NewClient()
		if err != nil {
			return err
		}
		defer cl.Close()
		rc.Producer, admin = cl, kadm.NewClient(cl)
	}
	r := recon.New(rc)
	switch fs.Arg(0) {
	case "report":
		rep, err := recon.BuildReport(ctx, st, time.Now().Add(-time.Duration(hours)*time.Hour).Truncate(time.Hour))
		if err != nil {
			return err
		}
		if asJSON {
			return rep.WriteJSON(os.Stdout)
		}
		return rep.WriteText(os.Stdout)
	case "run":
		h := time.Now().Add(-time.Hour)
		if hour != "" {
			if h, err = time.Parse(time.RFC3339, hour); err != nil {
				return fmt.Errorf("--hour: %w", err)
			}
		}
		res, bad, err := r.Run(ctx, recon.Hour(h, recon.AttemptH1))
		if err != nil {
			return err
		}
		fmt.Printf("%d results, %d mismatches for the hour from %s\n", len(res), bad, h.Truncate(time.Hour).UTC().Format(time.RFC3339))
		if bad > 0 {
			return fmt.Errorf("recon: %d mismatches", bad)
		}
		return nil
	case "serve":
		if err := serveMetrics(ctx, v, log); err != nil {
			return err
		}
		keys, err := apiKeys(v, "recon.keys", log)
		if err != nil {
			return err
		}
		d := &recon.Dashboard{Store: st, Admin: admin, Keys: keys, Hours: hours, Log: log}
		if v.GetString("redis.addr") != "" { // the uin pool's level, from its Redis
			rdb, err := needRedis(ctx, v, "the operators' page's uin pool level")
			if err != nil {
				return err
			}
			defer rdb.Close()
			// Read only: no journal, nothing written.
			central := pool.NewCentral(rdb, uinkeys.Pool(v.GetString("uin.namespace")), v.GetInt("uin.buckets"))
			d.Pool = func(ctx context.Context) (recon.PoolLevel, error) {
				pooled, err := central.Size(ctx)
				if err != nil {
					return recon.PoolLevel{}, err
				}
				leased, err := central.Leased(ctx)
				return recon.PoolLevel{Pooled: pooled, Leased: leased}, err
			}
		}
		hs := &http.Server{Addr: v.GetString("recon.http_addr"), Handler: metrics.Default.InstrumentHTTP("recon", d.Handler()),
			ReadHeaderTimeout: 5 * time.Second}
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
		}()
		go func() {
			log.Info("recon: page serving", "addr", hs.Addr)
			if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("recon: page", "err", err)
			}
		}()
		r.Serve(ctx, time.Minute)
		return nil
	}
	return fmt.Errorf("recon: unknown action %q (report, run, serve)", fs.Arg(0))
}
