package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

const pushUsage = `surge push ACTION --job ID [--reason TEXT]: control a send job
  pause   stop dispatching it (units already with executors still go out)
  resume  dispatch a paused job again
  cancel  end it; its targets not yet dispatched get their quota back
The planner applies the command (push.job-commands) as a transition on
push.job-transitions, or dead-letters it with the reason it cannot.
surge push drain --executor NAME [--reason TEXT]: drain an executor for an
  upgrade, as SIGTERM does: it takes no new units, finishes those it holds
  and exits 0 (push.executor-commands; only a running executor hears it).
`

func cmdPush(ctx context.Context, args []string) error {
	var jobID, executor, reason string
	v, fs, err := loadConfig("push", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&jobID, "job", "", "the job's id")
		fs.StringVar(&executor, "executor", "", "the executor's name (drain)")
		fs.StringVar(&reason, "reason", "", "why (kept on the transition)")
	})
	if err != nil {
		return err
	}
	if fs.NArg() == 1 && fs.Arg(0) == "drain" {
		return drainExecutor(ctx, v, executor, reason)
	}
	ops := map[string]pb.JobCommand_Op{"pause": pb.JobCommand_PAUSE, "resume": pb.JobCommand_RESUME, "cancel": pb.JobCommand_CANCEL}
	op, ok := ops[fs.Arg(0)]
	if fs.NArg() != 1 || !ok {
		fmt.Fprint(os.Stderr, pushUsage)
		return fmt.Errorf("push takes one action: pause, resume, cancel or drain")
	}
	if jobID == "" {
		return fmt.Errorf("push %s needs --job", fs.Arg(0))
	}
	topic := v.GetString("push.namespace") + schemas.TopicJobCommands
	rec, err := streams.NewRecord(topic, []byte(jobID), &pb.JobCommand{JobId: jobID, Op: op, Reason: reason,
		RequestedBy: requestedBy("surge push"), AtMs: time.Now().UnixMilli()})
	if err != nil {
		return err
	}
	if _, err := produceOne(ctx, v, rec); err != nil {
		return fmt.Errorf("push %s: %w", fs.Arg(0), err)
	}
	fmt.Printf("%s of job %s requested on %s; the planner's answer is on %s (a refusal on %s)\n",
		fs.Arg(0), jobID, topic, v.GetString("push.namespace")+schemas.TopicJobTransitions, schemas.TopicDeadLetter)
	return nil
}

// drainExecutor publishes a drain command for the executor called name.
func drainExecutor(ctx context.Context, v *viper.Viper, name, reason string) error {
	if name == "" {
		return fmt.Errorf("push drain needs --executor")
	}
	topic := v.GetString("push.namespace") + schemas.TopicExecCommands
	rec, err := streams.NewRecord(topic, []byte(name), &pb.ExecutorCommand{Executor: name, Op: pb.ExecutorCommand_DRAIN,
		Reason: reason, RequestedBy: requestedBy("surge push drain"), AtMs: time.Now().UnixMilli()})
	if err != nil {
		return err
	}
	if _, err := produceOne(ctx, v, rec); err != nil {
		return fmt.Errorf("push drain: %w", err)
	}
	fmt.Printf("drain of executor %s requested on %s; it exits 0 once its units are done\n", name, topic)
	return nil
}

// requestedBy names who asked, for the records a command publishes: the
// command and the operator's login.
func requestedBy(command string) string {
	if u := os.Getenv("USER"); u != "" {
		return command + " (" + u + ")"
	}
	return command
}

// produceOne publishes rec with a client of the configured brokers and
// returns it as the broker took it (partition and offset).
func produceOne(ctx context.Context, v *viper.Viper, rec *kgo.Record) (*kgo.Record, error) {
	cl, err := newClient(ctx, v)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return cl.ProduceSync(ctx, rec).First()
}
