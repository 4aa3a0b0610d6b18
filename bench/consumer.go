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

// sink is the loopback receiver both consumer rows POST to: it reads the
// body, counts distinct Idempotency-Keys and answers 204.
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
// hosts the JetStream server and the receiver).
func (e *env) bareLoop(ctx context.Context, s *sink, n, inFlight int) (float64, error) {
	start := time.Now()
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- bareDeliver(lctx, e.js, "bench-bare", s.url, inFlight) }()
	err := e.waitFor(ctx, 10*time.Minute, "bare pull-POST-ack loop", func() (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("bare loop ended early: %v", err)
		default:
		}
		return s.n.Load() >= int64(n), nil
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
// this process's runtime with the server and the receiver is worth.
func (e *env) bareLoopProcess(ctx context.Context, s *sink, n, inFlight int) (float64, int64, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, 0, err
	}
	start, selfCPU := time.Now(), ownCPU()
	args := []string{"-in-flight", fmt.Sprint(inFlight), "-bare-consumer-child", e.srv.ClientURL() + " " + s.url}
	if e.cfg.ProfileDir != "" {
		args = append(args, "-profile-dir", e.cfg.ProfileDir, "-profile-seconds", fmt.Sprint(e.cfg.ProfileSecs))
	}
	p, err := e.procs.Start("bare-consumer", self, args)
	if err != nil {
		return 0, 0, err
	}
	err = e.waitFor(ctx, 10*time.Minute, "bare pull-POST-ack process", func() (bool, error) {
		if p.Exited() {
			return false, errors.New("bare loop process ended early")
		}
		return s.n.Load() >= int64(n), nil
	})
	elapsed := time.Since(start)
	printCPU("bare loop process", n, p.Pid(), selfCPU)
	rss, stopErr := p.StopPeakRSS(20 * time.Second)
	if err == nil {
		err = stopErr
	}
	if err != nil {
		return 0, 0, err
	}
	return float64(n) / elapsed.Seconds(), rss, nil
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

// printCPU prints the CPU time per delivery of child process pid and of
// this process (the JetStream server and the receiver) since selfStart.
func printCPU(name string, n, pid int, selfStart time.Duration) {
	child, err := processCPU(pid)
	if err != nil {
		fmt.Printf("bench: consumer: %s: CPU time: %v\n", name, err)
		return
	}
	self := ownCPU() - selfStart
	fmt.Printf("bench: consumer: %s: CPU %.1f µs/delivery (bench process, server and receiver: %.1f µs/delivery)\n",
		name, float64(child.Microseconds())/float64(n), float64(self.Microseconds())/float64(n))
}

// bareDeliver pulls from durable on EVENTS with inFlight workers, each
// POSTing the message data to url and acking, until ctx ends.
func bareDeliver(ctx context.Context, js jetstream.JetStream, durable, url string, inFlight int) error {
	cons, err := js.CreateOrUpdateConsumer(ctx, wire.DefaultEventsStream, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
		MaxAckPending: 1000, FilterSubjects: []string{wire.All(wire.DefaultEventsPrefix)},
	})
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: inFlight, MaxConnsPerHost: inFlight}, Timeout: 10 * time.Second}
	iter, err := cons.Messages(jetstream.PullMaxMessages(inFlight))
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
				req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(msg.Data()))
				req.Header.Set(wire.HeaderIdempotencyKey, wire.IdempotencyKey(msg.Headers().Get(wire.HeaderMsgID)))
				req.Header.Set(wire.HeaderContentType, "application/json")
				resp, err := client.Do(req)
				if err != nil {
					_ = msg.Nak()
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				_ = msg.Ack()
			}
		})
	}
	<-ctx.Done()
	iter.Stop()
	wg.Wait()
	return nil
}

// consumerRow: n messages in EVENTS; the bare loop delivers them, then the
// consumer process (signing on, inFlight in flight) delivers them again on
// its own durable consumer.
func (e *env) consumerRow(ctx context.Context) (row, int64, error) {
	n, inFlight := e.cfg.Messages, e.cfg.InFlight
	if err := e.freshEventsStream(ctx); err != nil {
		return row{}, 0, err
	}
	if _, err := e.publishAsync(ctx, backlog(n, 1000)); err != nil {
		return row{}, 0, err
	}
	s, err := newSink()
	if err != nil {
		return row{}, 0, err
	}
	defer s.srv.Close()

	ref, err := e.bareLoop(ctx, s, n, inFlight)
	if err != nil {
		return row{}, 0, err
	}
	fmt.Printf("bench: consumer: bare pull → POST → ack loop %.0f deliveries/s\n", ref)
	s.reset()
	refProc, refRSS, err := e.bareLoopProcess(ctx, s, n, inFlight)
	if err != nil {
		return row{}, 0, err
	}
	fmt.Printf("bench: consumer: bare pull → POST → ack loop as a process %.0f deliveries/s, peak RSS %.0f MB\n", refProc, float64(refRSS)/(1<<20))
	s.reset()

	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	ops, err := proc.FreePort()
	if err != nil {
		return row{}, 0, err
	}
	start, selfCPU := time.Now(), ownCPU()
	args := []string{"run",
		"--nats-url", e.srv.ClientURL(), "--start", "all", "--name", "bench", "--filter", wire.All(wire.DefaultEventsPrefix), "--url", s.url,
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
		return row{}, 0, err
	}
	e.profile("consumer", ops)
	e.profileSelf("server-during-consumer")
	err = e.waitFor(ctx, 10*time.Minute, "consumer", func() (bool, error) { return s.n.Load() >= int64(n), nil })
	if err != nil {
		return row{}, 0, err
	}
	ours := float64(n) / time.Since(start).Seconds()
	printCPU("consumer process", n, p.Pid(), selfCPU)
	rss, err := p.StopPeakRSS(20 * time.Second)
	if err != nil {
		return row{}, 0, err
	}
	fmt.Printf("bench: consumer: %.0f deliveries/s, peak RSS %.0f MB\n", ours, float64(rss)/(1<<20))
	ratio := ours / ref
	return row{
		Name:      fmt.Sprintf("consumer throughput: %d messages → signed POST to a loopback receiver → ack, %d in flight", n, inFlight),
		Ours:      fmt.Sprintf("%.0f deliveries/s", ours),
		Reference: fmt.Sprintf("%.0f deliveries/s (bare pull → POST → ack; as its own process: %.0f)", ref, refProc),
		Ratio:     fmt.Sprintf("%.2f", ratio),
		Target:    "≥ 0.8 and ≥ 10,000/s",
		Met:       ratio >= 0.8 && ours >= 10_000,
	}, rss, nil
}
