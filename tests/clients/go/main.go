// Command kgo-client drives franz-go (kgo) against a Kafka bootstrap for the
// integration tests: it produces records (idempotent, or in transactions that
// commit and abort), reads them back, and prints one JSON summary line, so a
// pytest test can check what a Go client saw through mirrorguard.
//
//	kgo-client -bootstrap 127.0.0.1:9092 -topic t -mode roundtrip -n 50
//	kgo-client -bootstrap 127.0.0.1:9092 -topic t -mode txn -n 10
//	kgo-client -bootstrap 127.0.0.1:9092 -topic t -mode produce-one -partition 1
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

type summary struct {
	Mode      string   `json:"mode"`
	Produced  int      `json:"produced"`
	Offsets   []int64  `json:"offsets,omitempty"`
	Consumed  []string `json:"consumed,omitempty"`
	Brokers   []string `json:"brokers,omitempty"`
	Error     string   `json:"error,omitempty"`
	ErrorCode int16    `json:"error_code,omitempty"`
	Retriable bool     `json:"retriable,omitempty"`
}

func main() {
	bootstrap := flag.String("bootstrap", "", "bootstrap address")
	topic := flag.String("topic", "", "topic")
	mode := flag.String("mode", "roundtrip", "roundtrip | txn | produce-one")
	n := flag.Int("n", 10, "records per step")
	partition := flag.Int("partition", 0, "partition")
	timeout := flag.Duration("timeout", 45*time.Second, "overall deadline")
	flag.Parse()
	if *bootstrap == "" || *topic == "" {
		fmt.Fprintln(os.Stderr, "kgo-client: -bootstrap and -topic are required")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	s := summary{Mode: *mode}
	var err error
	switch *mode {
	case "roundtrip":
		err = roundtrip(ctx, &s, *bootstrap, *topic, int32(*partition), *n)
	case "txn":
		err = transactions(ctx, &s, *bootstrap, *topic, int32(*partition), *n)
	case "produce-one":
		err = produceOne(ctx, &s, *bootstrap, *topic, int32(*partition))
	default:
		err = fmt.Errorf("unknown mode %q", *mode)
	}
	if err != nil {
		s.Error = err.Error()
		var ke *kerr.Error
		if errors.As(err, &ke) {
			s.ErrorCode = ke.Code
			s.Retriable = ke.Retriable
		}
	}
	out, _ := json.Marshal(s)
	fmt.Println(string(out))
	if err != nil && *mode != "produce-one" {
		os.Exit(1)
	}
}

func baseOpts(bootstrap string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(bootstrap),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequestTimeoutOverhead(5 * time.Second),
		kgo.RetryTimeout(20 * time.Second),
	}
}

// brokers records every address the client learned from Metadata.
func brokers(ctx context.Context, cl *kgo.Client, s *summary) {
	md, err := cl.Request(ctx, kmsgMetadata())
	if err != nil {
		return
	}
	s.Brokers = append(s.Brokers, metadataBrokers(md)...)
}

func produce(ctx context.Context, cl *kgo.Client, s *summary, topic string, p int32, prefix string, n int) error {
	for i := 0; i < n; i++ {
		r := &kgo.Record{Topic: topic, Partition: p, Value: []byte(fmt.Sprintf("%s-%d", prefix, i))}
		res := cl.ProduceSync(ctx, r)
		if err := res.FirstErr(); err != nil {
			return err
		}
		s.Produced++
		s.Offsets = append(s.Offsets, r.Offset)
	}
	return nil
}

func consume(ctx context.Context, s *summary, bootstrap, topic string, p int32, want int, committed bool) error {
	opts := append(baseOpts(bootstrap), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
		topic: {p: kgo.NewOffset().AtStart()},
	}), kgo.FetchMaxWait(200*time.Millisecond))
	if committed {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for len(s.Consumed) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("consumed %d of %d: %w", len(s.Consumed), want, ctx.Err())
		}
		for _, e := range fs.Errors() {
			return fmt.Errorf("fetch %s-%d: %w", e.Topic, e.Partition, e.Err)
		}
		fs.EachRecord(func(r *kgo.Record) { s.Consumed = append(s.Consumed, string(r.Value)) })
	}
	return nil
}

// roundtrip: an idempotent producer (kgo's default) writes n records, a consumer
// reads them back from offset 0.
func roundtrip(ctx context.Context, s *summary, bootstrap, topic string, p int32, n int) error {
	cl, err := kgo.NewClient(baseOpts(bootstrap)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	brokers(ctx, cl, s)
	if err := produce(ctx, cl, s, topic, p, "kgo", n); err != nil {
		return err
	}
	return consume(ctx, s, bootstrap, topic, p, n, false)
}

// transactions: one aborted and one committed transaction of n records each, then a
// read_committed consumer must see only the committed ones (it stops at n records;
// the test checks which they are).
func transactions(ctx context.Context, s *summary, bootstrap, topic string, p int32, n int) error {
	opts := append(baseOpts(bootstrap), kgo.TransactionalID("kgo-"+topic), kgo.TransactionTimeout(30*time.Second))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	brokers(ctx, cl, s)
	for _, outcome := range []kgo.TransactionEndTry{kgo.TryAbort, kgo.TryCommit} {
		if err := cl.BeginTransaction(); err != nil {
			return err
		}
		prefix := "kgo-committed"
		if outcome == kgo.TryAbort {
			prefix = "kgo-aborted"
		}
		if err := produce(ctx, cl, s, topic, p, prefix, n); err != nil {
			return err
		}
		if err := cl.EndTransaction(ctx, outcome); err != nil {
			return err
		}
	}
	return consume(ctx, s, bootstrap, topic, p, n, true)
}

// produceOne: one record without retries beyond the client's own; the error (if any)
// is reported with its Kafka code (the guard answers POLICY_VIOLATION).
func produceOne(ctx context.Context, s *summary, bootstrap, topic string, p int32) error {
	cl, err := kgo.NewClient(append(baseOpts(bootstrap), kgo.DisableIdempotentWrite())...)
	if err != nil {
		return err
	}
	defer cl.Close()
	return produce(ctx, cl, s, topic, p, "kgo-one", 1)
}
