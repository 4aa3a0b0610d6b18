package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// The end-to-end row's CPU per event: on a shared machine a duration
// says as much about the other engineers' runs as about ours, the CPU
// each process spent per event much less.

// e2eCPU is the CPU time (user + system) used so far by each process on
// the end-to-end path.
type e2eCPU struct {
	bridge, consumer time.Duration
	// server is the JetStream server's process.
	server time.Duration
	// self is this process: the producers and the receiver.
	self time.Duration
	// postgres is the Postgres server's processes (the postmaster and its
	// children: backends, WAL writer, checkpointer, ...); 0 when not read.
	postgres time.Duration
}

// sampleCPU reads e2eCPU now; a process that cannot be read counts 0.
func (e *env) sampleCPU(ctx context.Context, bridgePid, consumerPid, serverPid int) e2eCPU {
	var c e2eCPU
	c.bridge, _ = processCPU(bridgePid)
	c.consumer, _ = processCPU(consumerPid)
	c.server, _ = processCPU(serverPid)
	c.self = ownCPU()
	c.postgres = e.postgresCPU(ctx)
	return c
}

// postgresCPU is the CPU time the Postgres server's processes (the
// postmaster and its children) have used so far; 0 when not read.
func (e *env) postgresCPU(ctx context.Context) time.Duration {
	var backend int
	if err := e.pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0
	}
	pm, err := parentPid(backend)
	if err != nil {
		return 0
	}
	return treeCPU(pm)
}

// perEvent formats the CPU each process used per event between a and b,
// and how many of the machine's cores they kept busy together over wall.
func (a e2eCPU) perEvent(b e2eCPU, events int, wall time.Duration) string {
	us := func(d time.Duration) string {
		return fmt.Sprintf("%.0f µs", float64(d.Microseconds())/float64(max(events, 1)))
	}
	return fmt.Sprintf("CPU per event: bridge %s, consumer %s, Postgres %s, JetStream server %s, bench process (producers, receiver) %s",
		us(b.bridge-a.bridge), us(b.consumer-a.consumer), us(b.postgres-a.postgres), us(b.server-a.server), us(b.self-a.self)) +
		fmt.Sprintf(" (all %.2f of %d cores busy)", (all(b)-all(a)).Seconds()/wall.Seconds(), runtime.NumCPU())
}

// all is the CPU time of every process in c.
func all(c e2eCPU) time.Duration { return c.bridge + c.consumer + c.server + c.self + c.postgres }

// parentPid is the parent of process pid, from /proc/<pid>/stat.
func parentPid(pid int) (int, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(f[1])
}

// statFields are the fields of /proc/<pid>/stat after the command name:
// state, ppid, ...
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return nil, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return f, nil
}

// treeCPU is the CPU time of process root and its children (not
// grandchildren: Postgres' processes are all the postmaster's), the
// children that have ended and been reaped included (root's cutime and
// cstime): a backend whose session ended during a run, such as the live
// rows' generator's, still counts.
func treeCPU(root int) time.Duration {
	total, _ := processCPU(root)
	if f, err := statFields(root); err == nil && len(f) >= 15 {
		cu, err1 := strconv.ParseInt(f[13], 10, 64)
		cs, err2 := strconv.ParseInt(f[14], 10, 64)
		if err1 == nil && err2 == nil {
			total += time.Duration(cu+cs) * 10 * time.Millisecond
		}
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if ppid, err := parentPid(pid); err == nil && ppid == root {
			if c, err := processCPU(pid); err == nil {
				total += c
			}
		}
	}
	return total
}
