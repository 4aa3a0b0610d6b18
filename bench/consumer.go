package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/wire"
)

// sink is the loopback receiver: it reads the body, counts distinct
// Idempotency-Keys and answers 204. The tracing row runs it in this
// process; the consumer row in a process of its own (receiver.go).
type sink struct {
	mu   sync.Mutex
	seen map[string]bool
	n    atomic.Int64
	srv  *http.Server
	url  string
}

func newSink() (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &sink{seen: map[string]bool{}, url: "http://" + ln.Addr().String() + "/hook"}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get(wire.HeaderIdempotencyKey)
	s.mu.Lock()
	if !s.seen[key] {
		s.seen[key] = true
		s.n.Add(1)
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *sink) reset() {
	s.mu.Lock()
	s.seen = map[string]bool{}
	s.n.Store(0)
	s.mu.Unlock()
}

// bareLoop is the reference: pull → POST → ack with inFlight workers and no
// signing, on its own durable consumer, inside this process (which also
// hosts the JetStream server), to the receiver process r.
func (e *env) bareLoop(ctx context.Context, r *receiver, n, inFlight int) (float64, error) {
	start := time.Now()
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- bareDeliver(lctx, e.js, "bench-bare", r.url, inFlight) }()
	err := e.waitFor(ctx, 10*time.Minute, "bare pull-POST-ack loop", func() (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("bare loop ended early: %v", err)
		default:
		}
		return r.reached(n)
	})
	elapsed := time.Since(start)
	stop()
	if err != nil {
		return 0, err
	}
	if err := <-done; err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

// bareLoopProcess is the same reference run as a child process
// (bench -bare-consumer-child), as the consumer runs: it shows what sharing
// this process's runtime with the server is worth. It returns the
// deliveries per second, the loop's peak RSS and the CPU time of the loop
// process and of the receiver.
func (e *env) bareLoopProcess(ctx context.Context, self string, r *receiver, n, inFlight int) (float64, int64, cpuPair, error) {
	start, selfCPU, recvCPU := time.Now(), ownCPU(), r.cpuNow()
	args := []string{"-in-flight", fmt.Sprint(inFlight), "-bare-consumer-child", e.srv.ClientURL() + " " + r.url}
	if e.cfg.ProfileDir != "" {
		args = append(args, "-profile-dir", e.cfg.ProfileDir, "-profile-seconds", fmt.Sprint(e.cfg.ProfileSecs))
	}
	p, err := e.procs.Start("bare-consumer", self, args)
	if err != nil {
		return 0, 0, cpuPair{}, err
	}
	err = e.waitFor(ctx, 10*time.Minute, "bare pull-POST-ack process", func() (bool, error) {
		if p.Exited() {
			return false, errors.New("bare loop process ended early")
		}
		return r.reached(n)
	})
	elapsed := time.Since(start)
	cpu := printCPU("bare loop process", n, p.Pid(), selfCPU, r, recvCPU)
	rss, stopErr := p.StopPeakRSS(20 * time.Second)
	if err == nil {
		err = stopErr
	}
	if err != nil {
		return 0, 0, cpuPair{}, err
	}
	return float64(n) / elapsed.Seconds(), rss, cpu, nil
}

// bareConsumerChild is the -bare-consumer-child mode: arg is "<nats-url>
// <sink-url>"; it runs bareDeliver on durable bench-bare-process until ctx
// ends (SIGTERM).
func bareConsumerChild(ctx context.Context, arg string, inFlight int, profileDir string, profileSecs int) error {
	natsURL, sinkURL, ok := strings.Cut(arg, " ")
	if !ok {
		return fmt.Errorf("-bare-consumer-child %q: want \"<nats-url> <sink-url>\"", arg)
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if profileDir != "" {
		// Like the consumer's profile (env.profile): from 0.5 s in.
		if err := os.MkdirAll(profileDir, 0o755); err != nil {
			return err
		}
		f, err := os.Create(filepath.Join(profileDir, "bare-consumer.cpu.pprof"))
		if err != nil {
			return err
		}
		defer f.Close()
		go func() {
			time.Sleep(500 * time.Millisecond)
			if pprof.StartCPUProfile(f) == nil {
				time.Sleep(time.Duration(profileSecs) * time.Second)
				pprof.StopCPUProfile()
			}
		}()
	}
	return bareDeliver(ctx, js, "bench-bare-process", sinkURL, inFlight)
}

// ownCPU is the CPU time (user + system) this process has used so far.
func ownCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// processCPU is the CPU time (user + system) process pid has used so far,
// from /proc/<pid>/stat.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name (which may hold spaces) in ")":
	// state is field 3, utime 14, stime 15 (clock ticks, 100 a second).
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// cpuPair is the CPU time (user + system) of a client process (the
// consumer or the bare loop) and of the receiver it delivered to.
type cpuPair struct{ client, receiver time.Duration }

// printCPU prints and returns the CPU time of child process pid (over its
// whole life) and of receiver r since recvStart, and prints this
// process's (the JetStream server) since selfStart, per delivery of n. A
// figure that cannot be read is printed as such and returned as 0.
func printCPU(name string, n, pid int, selfStart time.Duration, r *receiver, recvStart time.Duration) cpuPair {
	self := ownCPU() - selfStart
	child, err := processCPU(pid)
	if err != nil {
		fmt.Printf("bench: consumer: %s: CPU time: %v\n", name, err)
		child = 0
	}
	recv, err := r.cpu()
	if err != nil {
		fmt.Printf("bench: consumer: receiver: CPU time: %v\n", err)
		recv, recvStart = 0, 0
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	fmt.Printf("bench: consumer: %s: CPU %.1f µs/delivery (receiver process %.1f µs/delivery; bench process, the JetStream server: %.1f µs/delivery)\n",
		name, per(child), per(recv-recvStart), per(self))
	return cpuPair{client: child, receiver: recv - recvStart}
}

// bareDeliver pulls from durable on EVENTS with inFlight workers, each
// POSTing the message data to url and acking, until ctx ends.
func bareDeliver(ctx context.Context, js jetstream.JetStream, durable, url string, inFlight int) error {
	request := func(msg jetstream.Msg) *http.Request {
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(msg.Data()))
		req.Header.Set(wire.HeaderIdempotencyKey, wire.IdempotencyKey(msg.Headers().Get(wire.HeaderMsgID)))
		req.Header.Set(wire.HeaderContentType, "application/json")
		return req
	}
	return barePull(ctx, js, durable, inFlight, request, func(int) bool { return true })
}

// barePull pulls from durable on EVENTS with inFlight workers until ctx
// ends: each POSTs request(msg) and acks the message when ok(status), Naks
// it otherwise or when the POST fails. The smallest delivery loop, shared
// by the bare loop of the consumer row and the live rows' bare pipeline.
func barePull(ctx context.Context, js jetstream.JetStream, durable string, inFlight int,
	request func(jetstream.Msg) *http.Request, ok func(status int) bool) error {
	cons, err := js.CreateOrUpdateConsumer(ctx, wire.DefaultEventsStream, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
		MaxAckPending: 1000, FilterSubjects: []string{wire.All(wire.DefaultEventsPrefix)},
	})
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: inFlight, MaxConnsPerHost: inFlight}, Timeout: 10 * time.Second}
	// The consumer's heartbeat (2 s) and its answer to a missed one
	// (nats.go pulls again, no error): a pull request lost on the
	// server's side (nats.go issue 1622, seen in both processes) then
	// stalls the reference ~4 s, as it does the consumer, not 30-60 s.
	iter, err := cons.Messages(jetstream.PullMaxMessages(inFlight), jetstream.PullHeartbeat(2*time.Second),
		jetstream.WithMessagesErrOnMissingHeartbeat(false))
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for range inFlight {
		wg.Go(func() {
			for {
				msg, err := iter.Next()
				if err != nil {
					if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
						fmt.Fprintf(os.Stderr, "bench: bare loop (%s): worker stops: %v\n", durable, err)
					}
					return
				}
				resp, err := client.Do(request(msg))
				if err != nil {
					_ = msg.Nak()
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if ok(resp.StatusCode) {
					_ = msg.Ack()
				} else {
					_ = msg.Nak()
				}
			}
		})
	}
	<-ctx.Done()
	iter.Stop()
	wg.Wait()
	return nil
}

// consumerRow: n messages in EVENTS; the bare loop delivers them (in this
// process, then as a process of its own), then the consumer process
// (signing on, inFlight in flight) delivers them again on its own durable
// consumer; all three to the same receiver process. It returns the
// throughput row and the CPU-per-delivery row (consumer ÷ receiver), and
// the consumer's peak RSS.
func (e *env) consumerRow(ctx context.Context) ([]row, int64, error) {
	n, inFlight := e.cfg.Messages, e.cfg.InFlight
	if err := e.freshEventsStream(ctx); err != nil {
		return nil, 0, err
	}
	if _, err := e.publishAsync(ctx, backlog(n, 1000)); err != nil {
		return nil, 0, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, 0, err
	}
	r, err := e.startReceiver(ctx, self)
	if err != nil {
		return nil, 0, err
	}
	defer r.p.Stop(5 * time.Second)

	ref, err := e.bareLoop(ctx, r, n, inFlight)
	if err != nil {
		return nil, 0, err
	}
	fmt.Printf("bench: consumer: bare pull → POST → ack loop %.0f deliveries/s\n", ref)
	if err := r.reset(); err != nil {
		return nil, 0, err
	}
	refProc, refRSS, bareCPU, err := e.bareLoopProcess(ctx, self, r, n, inFlight)
	if err != nil {
		return nil, 0, err
	}
	fmt.Printf("bench: consumer: bare pull → POST → ack loop as a process %.0f deliveries/s, peak RSS %.0f MB\n", refProc, float64(refRSS)/(1<<20))
	if err := r.reset(); err != nil {
		return nil, 0, err
	}

	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	ops, err := proc.FreePort()
	if err != nil {
		return nil, 0, err
	}
	start, selfCPU, recvCPU := time.Now(), ownCPU(), r.cpuNow()
	args := []string{"run",
		"--nats-url", e.srv.ClientURL(), "--start", "all", "--name", "bench", "--filter", wire.All(wire.DefaultEventsPrefix), "--url", r.url,
		"--allow-private", "--max-in-flight", fmt.Sprint(inFlight), "--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops), "--log-level", "warn",
		// Against the bare loop, which has no order either; the ordered
		// rows (ordered.go) compare ordering stream with this.
		"--ordering", "none",
	}
	if e.cfg.ProfileDir != "" {
		args = append(args, "--pprof")
	}
	p, err := e.procs.Start("consumer", e.cfg.Bin+"/consumer", args, "JSBRIDGE_SECRET=whsec_"+base64.StdEncoding.EncodeToString(secret))
	if err != nil {
		return nil, 0, err
	}
	e.profile("consumer", ops)
	e.profile("receiver", r.port)
	e.profileSelf("server-during-consumer")
	err = e.waitFor(ctx, 10*time.Minute, "consumer", func() (bool, error) { return r.reached(n) })
	if err != nil {
		return nil, 0, err
	}
	ours := float64(n) / time.Since(start).Seconds()
	cpu := printCPU("consumer process", n, p.Pid(), selfCPU, r, recvCPU)
	rss, err := p.StopPeakRSS(20 * time.Second)
	if err != nil {
		return nil, 0, err
	}
	fmt.Printf("bench: consumer: %.0f deliveries/s, peak RSS %.0f MB\n", ours, float64(rss)/(1<<20))
	ratio := ours / ref
	return []row{{
		Name:      fmt.Sprintf("consumer throughput: %d messages → signed POST to a loopback receiver (a process of its own) → ack, %d in flight, ordering none", n, inFlight),
		Ours:      fmt.Sprintf("%.0f deliveries/s", ours),
		Reference: fmt.Sprintf("%.0f deliveries/s (bare pull → POST → ack in the bench process; as its own process: %.0f)", ref, refProc),
		Ratio:     fmt.Sprintf("%.2f", ratio),
		Target:    "≥ 0.95",
		Met:       ratio >= 0.95,
	}, consumerCPU{
		deliveries: n, consumer: cpu.client, receiver: cpu.receiver,
		bareLoop: bareCPU.client, bareReceiver: bareCPU.receiver,
	}.row()}, rss, nil
}
