// Package wallet is the reward wallet of DESIGN.md section 2: grants are
// accepted at peak rate and each cash grant yields a signed token at once
// (grant), booking into the ledger runs behind at its own capacity
// (ledger), and what a user sees is booked entries plus unbooked tokens.
// Coupons draw on Redis stock (stock); the live total is a flushed counter
// (counter); rate limits and degrade switches guard the weak dependencies
// (guard); the activity tree comes from a hot-reloaded file (config).
package wallet
