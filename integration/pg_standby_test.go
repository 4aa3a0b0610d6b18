package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// pgBin is where the Debian packages put the PostgreSQL 15 server
// programs (scripts/pg uses the newest /usr/lib/postgresql/*/bin).
func pgBin(t *testing.T) string {
	t.Helper()
	dirs, err := filepath.Glob("/usr/lib/postgresql/*/bin")
	require.NoError(t, err)
	require.NotEmpty(t, dirs, "PostgreSQL server binaries (scripts/pg installs them)")
	return dirs[len(dirs)-1]
}

// asPostgres runs a PostgreSQL program as the postgres user when the test
// runs as root (the server refuses root), from / as scripts/pg does.
func asPostgres(t *testing.T, name string, args ...string) string {
	t.Helper()
	prog := filepath.Join(pgBin(t), name)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", prog}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, prog, args...)
	}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s: %s", name, strings.Join(args, " "), out)
	return string(out)
}

// pgNode is one server of a primary/standby pair.
type pgNode struct {
	dir  string
	port int
}

func (n pgNode) ctl(t *testing.T, args ...string) {
	t.Helper()
	asPostgres(t, "pg_ctl", append([]string{"-D", n.dir, "-w", "-t", "60"}, args...)...)
}

// startStandbyPair starts a primary and a streaming standby of it in
// fresh directories on free ports, with synchronous replication (a commit
// returns once the standby has it, so a promoted standby has every
// committed event), and a database jsbridge. Both are stopped and removed
// at cleanup. It returns them and a multi-host URL that finds whichever
// one accepts writes (target_session_attrs=read-write), as an application
// behind a failover would be given.
func startStandbyPair(t *testing.T) (primary, standby pgNode, url string) {
	t.Helper()
	root, err := os.MkdirTemp("/tmp", "jsbridge-pgha-") // a place the postgres user can reach
	require.NoError(t, err)
	primary = pgNode{dir: filepath.Join(root, "primary"), port: freePort(t)}
	standby = pgNode{dir: filepath.Join(root, "standby"), port: freePort(t)}
	t.Cleanup(func() {
		for _, n := range []pgNode{standby, primary} {
			if _, err := os.Stat(filepath.Join(n.dir, "postmaster.pid")); err == nil {
				_ = exec.Command("runuser", "-u", "postgres", "--", filepath.Join(pgBin(t), "pg_ctl"), "-D", n.dir, "-m", "immediate", "-w", "stop").Run()
			}
		}
		_ = os.RemoveAll(root)
	})
	if os.Geteuid() == 0 {
		require.NoError(t, exec.Command("chown", "postgres", root).Run())
	}
	asPostgres(t, "initdb", "-D", primary.dir, "-U", "postgres", "--auth=trust", "-E", "UTF8")
	conf := func(n pgNode, extra string) {
		f, err := os.OpenFile(filepath.Join(n.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = fmt.Fprintf(f, "listen_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\n%s", n.port, root, extra)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	// fsync off: the test kills no machine, only servers.
	conf(primary, "fsync = off\n")
	primary.ctl(t, "-l", filepath.Join(primary.dir, "server.log"), "start")
	psql := func(sql string) string {
		return asPostgres(t, "psql", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres", "-d", "postgres", "-tAXqc", sql)
	}
	psql("CREATE DATABASE jsbridge")
	// -R writes standby.signal and primary_conninfo; -X stream copies the
	// WAL written during the copy; -c fast checkpoints at once instead of
	// spreading the checkpoint over minutes.
	asPostgres(t, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres", "-D", standby.dir, "-R", "-X", "stream", "-c", "fast")
	conf(standby, "")
	standby.ctl(t, "-l", filepath.Join(standby.dir, "server.log"), "start")
	// Synchronous from now on (not before: a commit with no standby
	// connected would wait forever). The standby's copy of the settings
	// predates this, so once promoted it commits alone.
	psql("ALTER SYSTEM SET synchronous_standby_names = '*'")
	psql("SELECT pg_reload_conf()")
	require.Eventually(t, func() bool {
		return strings.TrimSpace(psql("SELECT string_agg(sync_state, ',') FROM pg_stat_replication")) == "sync"
	}, 60*time.Second, 100*time.Millisecond, "the standby streams synchronously")
	url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/jsbridge?sslmode=disable&target_session_attrs=read-write",
		primary.port, standby.port)
	return primary, standby, url
}

// A primary and its synchronous streaming standby; the bridge and the
// application are given one multi-host URL. Mid-drain the primary crashes
// (immediate stop) and the standby is promoted: the bridge finds the new
// primary, listens there again and goes on. JetStream ends up with every
// event once, each stream in order, and the promoted standby's watermarks
// are at the heads. The bridge runs with the default lease (30 s): the
// streams whose settle or claim the crash cut are still leased to it on
// the promoted server, and it ends those leases at its first cycle there
// instead of waiting them out, so every event is in JetStream well inside
// half a lease of the promotion. (The drain pauses PollInterval after a
// failed cycle, doubling up to 30 s, without waking on a notification;
// the LISTEN is checked on the new primary itself.)
func TestBridgePostgresFailoverToPromotedStandby(t *testing.T) {
	t.Parallel()
	primary, standby, url := startStandbyPair(t)
	srv, js := testJetStream(t)
	env := []string{"DATABASE_URL=" + url, "JSBRIDGE_SCHEMA=ha"}
	out, err := cli(t, env, "bridge", "migrate")
	require.NoError(t, err, out)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	const streams, before = 40, 100
	// A backlog first, so that the crash comes in the middle of the drain.
	_, err = pool.Exec(context.Background(), "INSERT INTO ha.events (stream, version, name, data) "+
		"SELECT 'order-' || s, v, 'OrderNoted', '{}' FROM generate_series(0, $1 - 1) v, generate_series(0, $2 - 1) s ORDER BY v, s", before, streams)
	require.NoError(t, err)
	p := startBridgeProc(t, env, "--nats-url", srv.ClientURL(), "--ops-addr", "", "--claim-limit", "10", "--fetch-limit", "20")
	insert := func(v int) {
		t.Helper()
		require.Eventually(t, func() bool {
			// The pool's connections to the old primary die with it: the
			// first statements after the failover may fail.
			_, err := pool.Exec(context.Background(), "INSERT INTO ha.events (stream, version, name, data) "+
				"SELECT 'order-' || g, $1, 'OrderNoted', '{}' FROM generate_series(0, $2 - 1) g ORDER BY g", v, streams)
			return err == nil
		}, 30*time.Second, 100*time.Millisecond, "append round %d", v)
	}
	require.Eventually(t, func() bool { return jsMessages(js) >= 10*streams }, 30*time.Second, 5*time.Millisecond)

	primary.ctl(t, "-m", "immediate", "stop") // a crash: no shutdown checkpoint, connections cut
	crashed := time.Now()
	atCrash := jsMessages(js)
	t.Logf("primary crashed with %d of %d events in JetStream", atCrash, before*streams)
	require.Less(t, atCrash, uint64(before*streams), "the crash came in the middle of the drain")
	standby.ctl(t, "promote")
	promoted := time.Now()
	const after = before + 10
	for v := before; v < after; v++ {
		insert(v)
	}
	require.Eventually(t, func() bool { return jsMessages(js) >= streams*after }, 40*time.Second, 50*time.Millisecond,
		"JetStream holds %d of %d events; bridge output:\n%s", jsMessages(js), streams*after, p.output())
	took := time.Since(promoted)
	t.Logf("every event forwarded %v after the crash, %v after the promotion; taken back: %q",
		time.Since(crashed).Round(time.Millisecond), took.Round(time.Millisecond), takenBack(p.output()))
	require.Less(t, took, 15*time.Second, "no stream waited out its 30 s lease; bridge output:\n%s", p.output())
	heads := map[string]int64{}
	for s := range streams {
		heads[fmt.Sprintf("order-%d", s)] = after - 1
	}
	requireExactlyOnceInOrder(t, js, heads)
	var watermarks int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM ha.streams WHERE watermark = $1", after-1).Scan(&watermarks))
	require.Equal(t, int64(streams), watermarks, "every watermark at its head on the promoted standby")
	require.Contains(t, p.output(), "drain cycle failed", "the crash was seen")
	require.Eventually(t, func() bool { return listeningSessions(t, pool, "ha") == 1 }, 10*time.Second, 50*time.Millisecond,
		"the bridge listens on the promoted standby")
}

// takenBack returns the streams the bridge's log says it took back after
// a failed store call (the drain's "leases left by failed store calls
// ended" records), in the order logged.
func takenBack(logs string) []string {
	var out []string
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, "leases left by failed store calls ended") {
			continue
		}
		if _, rest, ok := strings.Cut(line, "streams=\"["); ok {
			list, _, _ := strings.Cut(rest, "]")
			out = append(out, strings.Fields(list)...)
		} else if _, rest, ok := strings.Cut(line, "streams=["); ok {
			list, _, _ := strings.Cut(rest, "]")
			out = append(out, strings.Fields(list)...)
		}
	}
	return out
}
