package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// ownEventsDirective marks what concerns only the bridge's own events table
// (creating it, its trigger), which is skipped when the store drains an
// existing one: a whole migration when it is the file's first line (the
// migration is then not recorded either), else the rest of the file from the
// line holding it.
const ownEventsDirective = "-- jsbridge:own-events-table"

// migration is one versioned, idempotent step of the schema.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations that apply to this store, in
// version order, with the schema injected. File names are NNN_name.sql.
func (s *Store) migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var ms []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("embedded migration %q: name is not NNN_name.sql", e.Name())
		}
		b, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, fmt.Errorf("read embedded migration %q: %w", e.Name(), err)
		}
		text := string(b)
		if s.External() {
			if strings.HasPrefix(text, ownEventsDirective) {
				continue
			}
			if i := strings.Index(text, "\n"+ownEventsDirective+"\n"); i >= 0 {
				text = text[:i+1]
			}
		}
		ms = append(ms, migration{version: v, name: e.Name(), sql: strings.ReplaceAll(text, "{schema}", s.schema)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// plan returns the statements Migrate runs when the migrations in applied
// are already recorded: creating the schema and the jsbridge_migrations
// table, then for each pending migration its text (which may hold several
// statements) and the statement recording it.
func (s *Store) plan(applied map[int]bool) ([]string, error) {
	ms, err := s.migrations()
	if err != nil {
		return nil, err
	}
	out := []string{s.q.createSchema, s.q.createMigrations}
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		out = append(out,
			fmt.Sprintf("-- migration %d (%s)\n%s", m.version, m.name, strings.TrimSpace(m.sql)),
			fmt.Sprintf(s.q.recordMigration, m.version))
	}
	return out, nil
}

// MigrationSQL returns, in order, every statement Migrate runs on an empty
// database (besides its transaction and advisory lock): creating the schema
// and the jsbridge_migrations table, then each migration's text with the
// schema injected and the statement recording it. With WithEventsTable the
// bridge's own events table and trigger are left out. It is for showing the
// SQL without running it.
func (s *Store) MigrationSQL() []string {
	stmts, err := s.plan(nil)
	if err != nil {
		// The migrations are embedded at build time; a bad name is a build bug.
		panic(err)
	}
	return stmts
}

// MigrationSQL returns the statements Migrate would run on an empty
// database for a store made with opts (WithSchema, WithEventsTable), without
// a connection (for `bridge migrate --dry-run`). Errors: a bad option
// (wrapping ErrInvalidConfig).
func MigrationSQL(opts ...Option) ([]string, error) {
	s, err := newStore(opts)
	if err != nil {
		return nil, err
	}
	return s.MigrationSQL(), nil
}

// AppliedMigration is one migration Migrate applied.
type AppliedMigration struct {
	// Version is the migration's number, e.g. 1.
	Version int
	// Name is its file name, e.g. "001_streams.sql".
	Name string
	// Objects are what it creates, in order, e.g. "table jsbridge.streams",
	// "index streams_pending_idx", "trigger jsbridge_events_inserted".
	Objects []string
}

// Migrate brings the schema up to date: it creates the schema if needed and
// runs the migrations not yet recorded in <schema>.jsbridge_migrations, all
// in one transaction under a Postgres advisory lock, so several bridges that
// start at once apply each migration exactly once. Running it on an
// up-to-date schema changes nothing. With WithEventsTable it creates only the
// bridge's own objects and never changes the events table: it checks that
// table's layout (error wrapping ErrEventsTableLayout, naming the table, the
// column and its type) and records its name in the schema, so operator
// commands find it (RecordedEventsTable). Without WithEventsTable, a schema
// recorded for an external events table and without one of its own is
// refused (error wrapping ErrInvalidConfig naming that table) rather than
// given an events table nobody writes. MigrateApplied says what was applied.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := s.MigrateApplied(ctx)
	return err
}

// MigrateApplied is Migrate, returning the migrations it applied in
// version order (none when the schema was up to date).
func (s *Store) MigrateApplied(ctx context.Context) ([]AppliedMigration, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate schema %s: begin: %w", s.schema, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if _, err := tx.Exec(ctx, s.q.migrationLock, "jsbridge.migrate."+s.schema); err != nil {
		return nil, fmt.Errorf("migrate schema %s: advisory lock: %w", s.schema, err)
	}
	if s.External() {
		if err := s.checkEventsTable(ctx, tx); err != nil {
			return nil, fmt.Errorf("migrate schema %s: %w", s.schema, err)
		}
	} else {
		recorded, err := s.recordedEventsTable(ctx, tx)
		if err != nil {
			return nil, fmt.Errorf("migrate schema %s: %w", s.schema, err)
		}
		if recorded != "" {
			return nil, fmt.Errorf("%w: schema %s is set up to drain the events table %s (an earlier Migrate with WithEventsTable(%q)); give that events table again, or another schema",
				ErrInvalidConfig, s.schema, recorded, recorded)
		}
	}
	applied := map[int]bool{}
	var exists bool
	if err := tx.QueryRow(ctx, s.q.migrationsExist).Scan(&exists); err != nil {
		return nil, fmt.Errorf("migrate schema %s: look for jsbridge_migrations: %w", s.schema, err)
	}
	if exists {
		rows, err := tx.Query(ctx, s.q.appliedVersions)
		if err != nil {
			return nil, fmt.Errorf("migrate schema %s: read applied versions: %w", s.schema, err)
		}
		versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return nil, fmt.Errorf("migrate schema %s: read applied versions: %w", s.schema, err)
		}
		for _, v := range versions {
			applied[int(v)] = true
		}
	}
	stmts, err := s.plan(applied)
	if err != nil {
		return nil, err
	}
	for _, q := range stmts {
		// No arguments: the simple protocol runs a migration's statements in turn.
		if _, err := tx.Exec(ctx, q); err != nil {
			return nil, fmt.Errorf("migrate schema %s: %s: %w", s.schema, firstLine(q), err)
		}
	}
	if s.External() {
		if _, err := tx.Exec(ctx, s.q.discoveryInit, s.eventsTable); err != nil {
			return nil, fmt.Errorf("migrate schema %s: record events table %s: %w", s.schema, s.eventsTable, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrate schema %s: commit: %w", s.schema, err)
	}
	ms, err := s.migrations()
	if err != nil {
		return nil, err
	}
	var out []AppliedMigration
	for _, m := range ms {
		if !applied[m.version] {
			out = append(out, AppliedMigration{Version: m.version, Name: m.name, Objects: createdObjects(m.sql)})
		}
	}
	return out, nil
}

// createStatement finds what a migration's CREATE and ALTER TABLE … ADD
// COLUMN statements create.
var createStatement = regexp.MustCompile(`(?im)^\s*(?:CREATE\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+)?(TABLE|INDEX|FUNCTION|TRIGGER|SCHEMA|SEQUENCE|VIEW)\s+(?:IF\s+NOT\s+EXISTS\s+)?([\w.]+)|ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?([\w.]+)\s+ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?(\w+))`)

// createdObjects lists, in order, the objects the CREATE statements of sql
// create, as "kind name", and the columns it adds, as "column table.name".
func createdObjects(sql string) []string {
	var out []string
	for _, m := range createStatement.FindAllStringSubmatch(sql, -1) {
		if m[1] == "" {
			out = append(out, "column "+m[3]+"."+m[4])
			continue
		}
		out = append(out, strings.ToLower(m[1])+" "+m[2])
	}
	return out
}

func firstLine(q string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(q), "\n")
	return line
}
