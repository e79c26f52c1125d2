package api

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is the wallet API's topology (it runs in `surge wallet` beside the
// ledger): grants are accepted over HTTP and published as tokens (cash)
// or grants (others); withdrawals are published and their answers read.
var Spec = streams.Spec{
	Name:    "wallet-api",
	Reads:   []string{schemas.TopicWithdrawResult},
	Outputs: []string{schemas.TopicTokens, schemas.TopicGrants, schemas.TopicWithdrawals},
	Stores:  []string{"redis: order claims, cash tokens per user, budgets, rate limits"},
	Doc:     "HTTP API: signed grants, users' balances, flows and withdrawals",
}
