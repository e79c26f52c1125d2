package streams

// Jitter is jitter, for the tests.
var Jitter = jitter
