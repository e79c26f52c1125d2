package ledger

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is the ledger's topology: tokens and withdrawals are co-partitioned
// by actID; each booking is a wallet.ledger entry written in the same
// transaction as the offsets of what it booked.
var Spec = streams.Spec{
	Name: "wallet-ledger", Group: "wallet-ledger", Guarantee: streams.ExactlyOnce,
	Inputs:  []string{schemas.TopicTokens, schemas.TopicWithdrawals, schemas.TopicPackets},
	Reads:   []string{schemas.TopicLedger},
	Outputs: []string{schemas.TopicLedger, schemas.TopicWithdrawResult, schemas.TopicPackets},
	Stores: []string{"pebble: balances and booked orders per account (from wallet.ledger)",
		"redis: balances for reads, the live total's per-partition sums"},
	Doc: "books each token and withdrawal once; answers withdrawals",
}
