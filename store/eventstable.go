package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ErrEventsTableLayout is wrapped by Migrate's error when an external events
// table (WithEventsTable) lacks a column of the common layout, or has a
// column of a type the bridge cannot read. The message names the table, the
// column and its type. Waiting does not fix it: the table or the
// configuration must change.
var ErrEventsTableLayout = errors.New("events table does not have the common layout")

// ErrEventsTableMissing is wrapped by Migrate's error when the external
// events table (WithEventsTable) does not exist (yet). Unlike
// ErrEventsTableLayout this may be transient, since the program that owns
// the table may not have created it yet; the bridge waits for it at start.
var ErrEventsTableMissing = errors.New("events table does not exist")

// eventsColumn is one column of the common layout and the types the fetch
// can read it as.
type eventsColumn struct {
	name string
	want string // for the error
	ok   func(typ, category string) bool
}

func integerType(typ, _ string) bool   { return typ == "int8" || typ == "int4" || typ == "int2" }
func textType(_, category string) bool { return category == "S" } // text, varchar, char, name, citext
func jsonType(typ, category string) bool {
	return typ == "jsonb" || typ == "json" || category == "S"
}
func timeType(typ, _ string) bool { return typ == "timestamptz" || typ == "timestamp" }

// eventsLayout is the common layout, in the fetch's column order. data and
// meta are read as text (the fetch casts them), so a text column works too;
// its content is checked per event.
var eventsLayout = []eventsColumn{
	{"id", "bigint, integer or smallint", integerType},
	{"stream", "text or varchar", textType},
	{"version", "bigint, integer or smallint", integerType},
	{"name", "text or varchar", textType},
	{"data", "jsonb, json or text", jsonType},
	{"meta", "jsonb, json or text", jsonType},
	{"created", "timestamptz or timestamp", timeType},
}

// checkEventsTable checks that the external events table exists and has
// every column of the common layout with a type the fetch can read; a
// domain counts as its base type. Other columns are ignored.
func (s *Store) checkEventsTable(ctx context.Context, q pgx.Tx) error {
	table := s.eventsIdent.Sanitize()
	var exists bool
	if err := q.QueryRow(ctx, s.q.eventsTableExists, table).Scan(&exists); err != nil {
		return fmt.Errorf("look for events table %s: %w", s.eventsTable, err)
	}
	if !exists {
		return fmt.Errorf("%w: %s (is the application that writes it migrated yet? is the events table name right?)", ErrEventsTableMissing, s.eventsTable)
	}
	rows, err := q.Query(ctx, s.q.eventsTableColumns, table)
	if err != nil {
		return fmt.Errorf("read the columns of events table %s: %w", s.eventsTable, err)
	}
	type column struct{ typ, category, shown string }
	cols := map[string]column{}
	var name string
	var c column
	_, err = pgx.ForEachRow(rows, []any{&name, &c.typ, &c.category, &c.shown}, func() error {
		cols[name] = c
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the columns of events table %s: %w", s.eventsTable, err)
	}
	var problems []string
	for _, want := range eventsLayout {
		got, ok := cols[want.name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("no column %s (want %s)", want.name, want.want))
		case !want.ok(got.typ, got.category):
			problems = append(problems, fmt.Sprintf("column %s is %s (want %s)", want.name, got.shown, want.want))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: events table %s: %s", ErrEventsTableLayout, s.eventsTable, strings.Join(problems, "; "))
	}
	return s.checkIDSequence(ctx, q)
}

// checkIDSequence checks that the sequence the id column draws from (an
// identity, a serial, or a DEFAULT nextval) keeps CACHE 1. With a larger
// cache each session takes a block of ids and uses it later without
// touching the sequence, so an id far below the others can commit long
// after discovery's scan position passed it, with no lock the position
// waits for: that event would be skipped. An id column without a sequence
// (the writer gives the ids) is not checked.
func (s *Store) checkIDSequence(ctx context.Context, q pgx.Tx) error {
	var seq string
	var cache int64
	err := q.QueryRow(ctx, s.q.eventsIDSequence, s.eventsIdent.Sanitize()).Scan(&seq, &cache)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the id sequence of events table %s: %w", s.eventsTable, err)
	}
	if cache != 1 {
		return fmt.Errorf("%w: events table %s: the id column's sequence %s has CACHE %d; the bridge needs CACHE 1 "+
			"(with a cache, an id handed out earlier can commit after the bridge's scan passed it, and be skipped): "+
			"ALTER SEQUENCE %s CACHE 1", ErrEventsTableLayout, s.eventsTable, seq, cache, seq)
	}
	return nil
}

// RecordedEventsTable returns the events table this store reads or should
// read: the one given with WithEventsTable; else, when the schema has no
// events table of its own, the external one recorded in it by Migrate (or
// a discovering bridge) with WithEventsTable; else "" (the bridge's own
// <schema>.events, or a schema not set up yet). Operator commands use it
// so that they work without repeating --events-table. More than one
// recorded table is an error naming them.
func (s *Store) RecordedEventsTable(ctx context.Context) (string, error) {
	if s.External() {
		return s.eventsTable, nil
	}
	var table string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		table, err = s.recordedEventsTable(ctx, tx)
		return err
	})
	return table, err
}

func (s *Store) recordedEventsTable(ctx context.Context, tx pgx.Tx) (string, error) {
	var own, discovery bool
	if err := tx.QueryRow(ctx, s.q.ownTables).Scan(&own, &discovery); err != nil {
		return "", fmt.Errorf("look for the events table of schema %s: %w", s.schema, err)
	}
	if own || !discovery {
		return "", nil
	}
	rows, err := tx.Query(ctx, s.q.recordedEventsTables)
	if err != nil {
		return "", fmt.Errorf("look for the events table of schema %s: %w", s.schema, err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("look for the events table of schema %s: %w", s.schema, err)
	}
	switch len(tables) {
	case 0:
		return "", nil
	case 1:
		return tables[0], nil
	}
	return "", fmt.Errorf("%w: schema %s has drained several events tables (%s): give the one to use (WithEventsTable)", ErrInvalidConfig, s.schema, strings.Join(tables, ", "))
}
