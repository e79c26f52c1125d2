// Package streams is the runtime for the product's stateless processors: it
// consumes input topics in a consumer group, hands each record to a Handler,
// produces what the handler emits, and commits, with one of two guarantees
// chosen per processor:
//
//   - ExactlyOnce: each batch runs in a Kafka transaction (franz-go's
//     GroupTransactSession): the outputs and the input offsets commit
//     together or not at all. A crash, a rebalance or a failed handler
//     aborts the batch and it is consumed again from the last commit, so
//     read_committed consumers of the outputs see each result once. Use it
//     where a duplicate output is money or a user-visible message.
//   - AtLeastOnce: outputs are flushed, then offsets are committed. A crash
//     between the two redelivers the batch, so outputs can repeat; the
//     downstream must be idempotent (keyed upserts, order-number checks).
//     It skips the transaction round trips, so it is cheaper.
//
// Records that can never succeed (they fail to decode, carry an unknown
// schema version, are oversized, or the handler rejects them) go to the
// dead-letter topic with the reason and their origin in headers, inside the
// same transaction as the batch; they never stop the processor. Transient
// handler errors are retried with back-off up to a limit, then dead-lettered.
//
// Back-pressure is by construction: a batch is fully produced and committed
// before the next poll. Shutdown (cancel the Run context) finishes the batch
// in flight, commits it, and leaves the group.
package streams
