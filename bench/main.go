// Command bench measures jsbridge against the raw limits of the same machine,
// in the same run, and prints one table (see docs/benchmarks.md):
//
//   - drain throughput: a Postgres backlog → JetStream (file storage, dedup
//     on), against a bare nats.go async-publish loop of the same messages,
//     and the CPU per event of the bridge against the JetStream server's;
//   - R3 drain: the same into an embedded 3-node cluster (3 replicas),
//     against a bare async publish to that cluster;
//   - claim latency p99 with many idle streams against few;
//   - fairness: append → stored latency spread under a sustained backlog
//     of thousands of streams (max ÷ p50), with 1 and 2 bridges;
//   - consumer throughput: JetStream → signed POST to a loopback receiver →
//     ack, against a bare pull → POST → ack loop with the same receiver, and
//     the consumer's CPU per delivery against the receiver's (the receiver
//     runs in a child process of its own, bench -receiver-child);
//   - tracing: drain and consumer throughput (in process) with tracing off
//     (the no-op provider) and on (the SDK with a batch span processor and a
//     discarding exporter);
//   - end to end: append → webhook received, at a steady rate;
//   - live: the bridge at steady rates over many streams, from an open-loop
//     generator, Postgres durable, against a bare reference bridge (poll
//     every 5 ms, read, async publish, one UPDATE a batch) in the same run
//     (live.go);
//   - live pipeline: the whole path, append → signed webhook verified by a
//     receiver process, bridge and consumer (one ordered and one unordered
//     subscription) over 10,000 streams with a skewed spread, against a
//     bare reference pipeline (the bare bridge, one pull consumer, POST,
//     ack) in the same run, and the highest rate each holds (livepipe.go);
//   - storage: the disk the events stream and what the consumer keeps
//     beside it (positions bucket, attempts stream) take per million
//     events, against the events stream alone;
//   - peak RSS of the bridge and the consumer processes at full speed;
//   - many subscriptions: what one consumer process and the JetStream server
//     hold at 100, 1,000 and 10,000 subscriptions, and 10,000 unordered
//     with 1,000 ordered together on a 3-node cluster (many.go); the
//     delivery throughput and CPU per webhook of 1,000 subscriptions
//     sharing one filter against one (manythroughput.go).
//
// The bridge and the consumer run as real processes from -bin (make build);
// the NATS server is embedded in this process; Postgres is the throwaway local
// one (scripts/pg) unless -database-url is given.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type config struct {
	Quick        bool
	Events       int
	Streams      int
	Messages     int
	InFlight     int
	IdleStreams  int
	Claims       int
	FairStreams  int
	FairPending  int
	FairWindow   time.Duration
	E2ERate      int
	E2EHighRate  int
	E2EDuration  time.Duration
	E2EOrdering  string
	E2ETimes     string
	Bin          string
	DatabaseURL  string
	Out          string
	Only         string
	Repo         string
	ProfileDir   string
	ProfileSecs  int
	BareChild    string
	ServerChild  string
	RecvChild    string
	ManySizes    []int
	ManyNodes    int
	ManyOrdering string
	// ManyMix is the mixed case's unordered and ordered subscriptions
	// (-many-mix); zero: not run.
	ManyMix [2]int
	// ManyThroughput is the throughput case's subscriptions sharing one
	// filter (-many-throughput), ManyWebhooks the webhooks each side of
	// it delivers; zero: not run.
	ManyThroughput int
	ManyWebhooks   int
	// ManyPicked is set when -many-sizes, -many-mix or -many-throughput
	// was: only the cases they name run.
	ManyPicked bool

	LiveRates      []int
	LiveDuration   time.Duration
	LiveStreams    int
	LiveBridgeArgs []string
	LiveGenChild   string
	LiveBareChild  string

	LivePipeRates   []int
	LivePipeStreams int
	LiveZipf        float64
	LiveDelay       time.Duration
	LiveHold        time.Duration
	LiveSearchSteps int
	LiveRecvChild   string
	// LivePipes are the pipelines the live pipeline rows run: ours
	// ("bridge") and the bare reference ("bare").
	LivePipes []livePipeline
}

func main() {
	var cfg config
	flag.BoolVar(&cfg.Quick, "quick", false, "small sizes (a run of under 3 minutes); the targets refer to the full sizes")
	flag.IntVar(&cfg.Events, "events", 1_000_000, "drain: events in the Postgres backlog (256 B of data each)")
	flag.IntVar(&cfg.Streams, "streams", 10_000, "drain: streams the backlog is spread over")
	flag.IntVar(&cfg.Messages, "messages", 200_000, "consumer: messages delivered")
	flag.IntVar(&cfg.InFlight, "in-flight", 64, "consumer: deliveries in flight")
	flag.IntVar(&cfg.IdleStreams, "idle-streams", 1_000_000, "claim: idle streams in the large case (the small case has 100)")
	flag.IntVar(&cfg.Claims, "claims", 2000, "claim: claims measured per case")
	flag.IntVar(&cfg.FairStreams, "fair-streams", 10_000, "fairness: streams the appends go to (one event each, to random streams)")
	flag.IntVar(&cfg.FairPending, "fair-pending", 2_500, "fairness: pending streams the appends keep (the backlog)")
	flag.DurationVar(&cfg.FairWindow, "fair-duration", 60*time.Second, "fairness: how long to append at the drain rate")
	flag.IntVar(&cfg.E2ERate, "e2e-rate", 1000, "end to end: events appended per second")
	flag.IntVar(&cfg.E2EHighRate, "e2e-high-rate", 5000, "end to end: a second run's events appended per second (target p99 ≤ 30 ms; 0 skips it, as -quick does)")
	flag.DurationVar(&cfg.E2EDuration, "e2e-duration", 30*time.Second, "end to end: how long to append")
	flag.StringVar(&cfg.E2EOrdering, "e2e-ordering", "", "end to end: the consumer's --ordering (empty: its default, stream)")
	flag.StringVar(&cfg.E2ETimes, "e2e-times", "", "end to end: also write each event's times (append, stored, received; Unix µs) as CSV to this file")
	flag.StringVar(&cfg.Bin, "bin", "bin", "directory holding the bridge and consumer binaries")
	flag.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL; empty starts the throwaway local one")
	flag.StringVar(&cfg.Out, "out", "", "also write the results as Markdown to this file (e.g. docs/benchmarks.md)")
	flag.StringVar(&cfg.Only, "only", "", "run only these rows, comma-separated: drain, r3, claim, fair, consumer, ordered, tracing, e2e, live, live-pipeline, storage, many")
	flag.StringVar(&cfg.Repo, "repo", ".", "repository root (for scripts/pg)")
	flag.StringVar(&cfg.ProfileDir, "profile-dir", "", "when set, save CPU profiles (-profile-seconds long) here as <name>.cpu.pprof, taken at full speed: the bridge and this process (which hosts the JetStream server) during the drain row, the consumer, the receiver, the bare loop process and this process during the consumer row, the first replica and this process during each ordered row, the bridge and the consumer during each rate of the live pipeline row (livepipe-bridge-<rate>.cpu.pprof, livepipe-consumer-<rate>.cpu.pprof, from the run's start), the idle consumer of each many row and the consumer from the window's opening on each side of the many throughput case")
	flag.IntVar(&cfg.ProfileSecs, "profile-seconds", 5, "with -profile-dir: how long each CPU profile runs, in seconds")
	flag.StringVar(&cfg.BareChild, "bare-consumer-child", "", "internal (the consumer row starts it): \"<nats-url> <sink-url>\": run the bare pull → POST → ack loop with -in-flight workers until SIGTERM (and save a CPU profile to -profile-dir)")
	flag.StringVar(&cfg.ServerChild, "nats-server-child", "", "internal (the many rows start it): \"<dir> <nodes>\": run a JetStream server (nodes 1) or cluster with its storage under dir, write its client URLs to dir/client-urls, until SIGTERM")
	flag.StringVar(&cfg.RecvChild, "receiver-child", "", "internal (the consumer row starts it): \"127.0.0.1:<port>\": serve the webhook receiver there (POST /hook, GET /count, POST /reset, GET /debug/pprof/profile) until SIGTERM")
	flag.Func("many-sizes", "many: subscription counts to measure, comma-separated, each on one server and on a 3-node cluster (default: 100, 1,000 and 10,000, 100 ordered on one server and 1,000 ordered on the cluster; quick: 100 on one server); setting it, -many-mix or -many-throughput runs only the cases they set", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 2 {
				return fmt.Errorf("-many-sizes: %q is not a count of at least 2", f)
			}
			cfg.ManySizes = append(cfg.ManySizes, n)
		}
		return nil
	})
	flag.IntVar(&cfg.ManyNodes, "many-nodes", 0, "many, with -many-sizes: only on one server (1) or only on the 3-node cluster (3); 0: both")
	flag.StringVar(&cfg.ManyOrdering, "many-ordering", "none", "many, with -many-sizes: the subscriptions' ordering, none or stream")
	cfg.ManyMix = [2]int{10_000, 1000}
	flag.Func("many-mix", "many: \"<unordered>,<ordered>\": subscriptions of both orderings run together by one consumer process, on the 3-node cluster (on one server with -many-nodes 1); default 10000,1000 (quick: not run)", func(v string) error {
		u, o, ok := strings.Cut(v, ",")
		nu, err1 := strconv.Atoi(strings.TrimSpace(u))
		no, err2 := strconv.Atoi(strings.TrimSpace(o))
		if !ok || err1 != nil || err2 != nil || nu < 2 || no < 1 {
			return fmt.Errorf("-many-mix: %q is not \"<unordered>,<ordered>\" (at least 2 and 1)", v)
		}
		cfg.ManyMix = [2]int{nu, no}
		return nil
	})
	flag.IntVar(&cfg.ManyThroughput, "many-throughput", 1000, "many: subscriptions sharing one filter in the throughput case, measured against one subscription delivering as many webhooks (-many-webhooks) (quick: 100)")
	flag.IntVar(&cfg.ManyWebhooks, "many-webhooks", 50_000, "many, throughput case: webhooks each side delivers (to one subscription, and to -many-throughput subscriptions, an event for every one of them each -many-throughput webhooks) (quick: 10000)")
	cfg.LiveRates = []int{100, 1000}
	flag.Func("live-rates", "live: the generator's rates, events/s, comma-separated (default 100,1000; quick: 1000); each runs the bridge, then the bare reference", func(v string) (err error) {
		cfg.LiveRates, err = liveRates(v)
		return err
	})
	flag.DurationVar(&cfg.LiveDuration, "live-duration", 20*time.Second, "live: how long the generator appends at each rate (quick: 8s)")
	flag.IntVar(&cfg.LiveStreams, "live-streams", 1000, "live: streams the generator appends to, one picked at random per event")
	flag.Func("live-bridge-args", "live: more flags for the bridge, space-separated (e.g. \"--linger 20ms\")", func(v string) error {
		cfg.LiveBridgeArgs = strings.Fields(v)
		return nil
	})
	flag.StringVar(&cfg.LiveGenChild, "live-generator-child", "", "internal (the live rows start it): \"<database URL> <schema> <events/s> <duration> <streams> <out file> [<zipf exponent>]\": append open loop, write the count to the out file and each event's commit to <out file>.commits, wait for SIGTERM")
	flag.StringVar(&cfg.LiveBareChild, "live-bare-child", "", "internal (the live rows start it): \"<database URL> <schema> <nats URL> [<webhook URL>]\": run the bare reference bridge (with a webhook URL: and the bare delivery, the bare pipeline) until SIGTERM")
	cfg.LivePipeRates = []int{500, 1000, 2000}
	flag.Func("live-pipeline-rates", "live pipeline: the generator's rates, events/s, comma-separated (default 500,1000,2000; quick: 1000); each runs our pipeline, then the bare one", func(v string) (err error) {
		cfg.LivePipeRates, err = liveRates(v)
		return err
	})
	flag.IntVar(&cfg.LivePipeStreams, "live-pipeline-streams", 10_000, "live pipeline: streams the generator appends to (see -live-zipf)")
	flag.Float64Var(&cfg.LiveZipf, "live-zipf", liveZipfExponent, "live pipeline: the Zipf exponent of the streams' spread (stream k gets a share ∝ 1/(k+1)^s; 0: uniform; 0.65 over 10,000 streams puts 1.44 % on the hottest)")
	flag.DurationVar(&cfg.LiveDelay, "live-receiver-delay", 5*time.Millisecond, "live pipeline: how long the receiver waits before answering each webhook")
	flag.DurationVar(&cfg.LiveHold, "live-hold", 60*time.Second, "live pipeline: how long each step of the search for the highest rate held runs")
	flag.IntVar(&cfg.LiveSearchSteps, "live-search-steps", 3, "live pipeline: runs of -live-hold each pipeline's search for its highest rate held takes (0 skips the search, as -quick does)")
	cfg.LivePipes = []livePipeline{"bridge", "bare"}
	flag.Func("live-pipelines", "live pipeline: which pipelines to run at each rate, comma-separated: bridge (ours), bare (the reference); default both (a sweep of the bridge's flags can leave the bare one out)", func(v string) error {
		cfg.LivePipes = nil
		for _, p := range strings.Split(v, ",") {
			switch p = strings.TrimSpace(p); p {
			case "bridge", "bare":
				cfg.LivePipes = append(cfg.LivePipes, livePipeline(p))
			default:
				return fmt.Errorf("unknown pipeline %q (bridge, bare)", p)
			}
		}
		return nil
	})
	flag.StringVar(&cfg.LiveRecvChild, "live-receiver-child", "", "internal (the live pipeline rows start it): \"127.0.0.1:<port> <delay>\": serve the verifying receiver there until SIGTERM")
	flag.Parse()
	if cfg.Quick {
		cfg.Events, cfg.Streams = 100_000, 1_000
		// At least MaxAckPending (1,000) per ordered partition (16): with
		// 10,000 the ordered rows measured mostly start-up, likely the
		// fence a partition starting with a backlog passes when it holds
		// that many (docs/performance.md).
		cfg.Messages = 20_000
		cfg.IdleStreams, cfg.Claims = 100_000, 500
		cfg.FairWindow = 8 * time.Second // twice: 1 bridge, then 2
		cfg.E2EDuration = 10 * time.Second
		cfg.E2EHighRate = 0 // the 3-minute budget
		if !flagSet("live-duration") {
			cfg.LiveDuration = 8 * time.Second
		}
		if !flagSet("live-rates") {
			cfg.LiveRates = []int{1000} // the 3-minute budget
		}
		if !flagSet("live-pipeline-rates") {
			cfg.LivePipeRates = []int{1000}
		}
		if !flagSet("live-search-steps") {
			cfg.LiveSearchSteps = 0
		}
	}

	// Setting one of -many-sizes, -many-mix, -many-throughput picks the
	// cases of -only many: only those.
	cfg.ManyPicked = flagSet("many-sizes") || flagSet("many-mix") || flagSet("many-throughput")
	if cfg.ManyPicked && !flagSet("many-mix") || cfg.Quick && !cfg.ManyPicked {
		cfg.ManyMix = [2]int{}
	}
	if cfg.ManyPicked && !flagSet("many-throughput") {
		cfg.ManyThroughput = 0
	}
	if cfg.Quick && !cfg.ManyPicked {
		cfg.ManyThroughput = 100
	}
	if cfg.Quick && !flagSet("many-webhooks") {
		cfg.ManyWebhooks = 10_000
	}
	if cfg.ManyThroughput < 0 || cfg.ManyThroughput > 0 && cfg.ManyWebhooks < cfg.ManyThroughput {
		fmt.Fprintf(os.Stderr, "bench: -many-throughput %d, -many-webhooks %d: want at least as many webhooks as subscriptions\n", cfg.ManyThroughput, cfg.ManyWebhooks)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.ServerChild != "" {
		if err := natsServerChild(ctx, cfg.ServerChild); err != nil {
			fmt.Fprintf(os.Stderr, "bench: JetStream server child: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if cfg.RecvChild != "" {
		if err := receiverChild(ctx, cfg.RecvChild); err != nil {
			fmt.Fprintf(os.Stderr, "bench: receiver child: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if cfg.LiveGenChild != "" {
		if err := liveGeneratorChild(ctx, cfg.LiveGenChild); err != nil {
			fmt.Fprintf(os.Stderr, "bench: live generator child: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if cfg.LiveRecvChild != "" {
		if err := liveReceiverChild(ctx, cfg.LiveRecvChild); err != nil {
			fmt.Fprintf(os.Stderr, "bench: live receiver child: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if cfg.LiveBareChild != "" {
		if err := bareBridgeChild(ctx, cfg.LiveBareChild); err != nil {
			fmt.Fprintf(os.Stderr, "bench: bare bridge child: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if cfg.BareChild != "" {
		if err := bareConsumerChild(ctx, cfg.BareChild, cfg.InFlight, cfg.ProfileDir, cfg.ProfileSecs); err != nil {
			fmt.Fprintf(os.Stderr, "bench: bare consumer child: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// flagSet reports whether the command line set flag name.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
