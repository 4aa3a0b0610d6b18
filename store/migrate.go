package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one versioned, idempotent step of the schema.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations in version order, with the
// schema injected. File names are NNN_name.sql.
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
		ms = append(ms, migration{version: v, name: e.Name(), sql: strings.ReplaceAll(string(b), "{schema}", s.schema)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// MigrationSQL returns, in order, every statement Migrate would run on an
// empty database: creating the schema and the jsbridge_migrations table, then
// the text of each migration with the schema injected (a migration's text may
// hold several statements). It is for showing the SQL without running it.
func (s *Store) MigrationSQL() []string {
	ms, err := s.migrations()
	if err != nil {
		// The migrations are embedded at build time; a bad name is a build bug.
		panic(err)
	}
	out := []string{s.q.createSchema + ";", s.q.createMigrations + ";"}
	for _, m := range ms {
		out = append(out, fmt.Sprintf("-- migration %d (%s)\n%s", m.version, m.name, m.sql))
	}
	return out
}

// MigrationSQL returns the statements Migrate would run for schema on an
// empty database, without a connection (for `bridge migrate --dry-run`).
// It fails when schema is not a plain identifier.
func MigrationSQL(schema string) ([]string, error) {
	s := &Store{schema: DefaultSchema}
	if err := WithSchema(schema)(s); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	s.q = newQueries(s.schema)
	return s.MigrationSQL(), nil
}

// Migrate brings the schema up to date: it creates the schema if needed and
// runs the migrations not yet recorded in <schema>.jsbridge_migrations, all
// in one transaction under a Postgres advisory lock, so several bridges that
// start at once apply each migration exactly once. Running it on an
// up-to-date schema changes nothing.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := s.migrations()
	if err != nil {
		return err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate schema %s: begin: %w", s.schema, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if _, err := tx.Exec(ctx, s.q.migrationLock, "jsbridge.migrate."+s.schema); err != nil {
		return fmt.Errorf("migrate schema %s: advisory lock: %w", s.schema, err)
	}
	for _, q := range []string{s.q.createSchema, s.q.createMigrations} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("migrate schema %s: %w", s.schema, err)
		}
	}
	rows, err := tx.Query(ctx, s.q.appliedVersions)
	if err != nil {
		return fmt.Errorf("migrate schema %s: read applied versions: %w", s.schema, err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("migrate schema %s: read applied versions: %w", s.schema, err)
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		applied[int(v)] = true
	}
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		// No arguments: the simple protocol runs the file's statements in turn.
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return fmt.Errorf("migrate schema %s: migration %d (%s): %w", s.schema, m.version, m.name, err)
		}
		if _, err := tx.Exec(ctx, s.q.recordMigration, m.version); err != nil {
			return fmt.Errorf("migrate schema %s: record migration %d: %w", s.schema, m.version, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate schema %s: commit: %w", s.schema, err)
	}
	return nil
}
