// Package wire is the bus contract in one place: what exactly jsbridge puts
// on NATS JetStream and on webhook requests, and nothing else. It defines
//
//   - the JetStream stream names and subject prefixes (stream.go): events
//     on EVENTS under "events", dead letters on DLQ under "dlq";
//   - the subject layout "<prefix>.<category>.<stream>.<name>", its inverse,
//     the filters over it and the category rule (subject.go);
//   - the two percent-encodings, side by side (escape.go): EscapeToken for
//     subject tokens (bytes outside [A-Za-z0-9_-]) and EncodeHeaderValue for
//     CloudEvents header values (space, '"', '%', control and non-ASCII
//     bytes), which follow different rules because NATS subjects and HTTP
//     header values forbid different bytes;
//   - the header names (header.go): CloudEvents ce-* attributes and
//     Content-Type, our extensions, the NATS headers we set, the dead
//     letters' Jsbridge-Dlq-* headers, and Idempotency-Key (= event id);
//   - ordered delivery's names (ordered.go): the partition function, the
//     partitioned copy's name (the rest of the old engine's layout is
//     package internal/migrate/legacy's), the lease and park
//     buckets' keys, the Jsbridge-Replica, Jsbridge-Partition and
//     Jsbridge-Lease-Epoch webhook headers, and the order gate's
//     Jsbridge-Order answers.
//
// It imports the standard library only, so every process and every
// receiver can depend on it. A test in this package fails when another
// package of the module spells a subject prefix or one of these header
// names as a string literal instead of using the constant here.
package wire
