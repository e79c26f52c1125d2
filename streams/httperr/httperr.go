// Package httperr is the error body every HTTP API of surge answers with:
//
//	{"error": "a sentence for people", "code": "a_word_for_programs"}
//
// as application/json, whatever refused the request (the handler, the key
// check or admission control). "error" stays a string, as it always was,
// so clients that print it keep working; "code" is what a client branches
// on. The codes are the Code constants; the HTTP status says the rest.
package httperr

import (
	"encoding/json"
	"net/http"
)

// Code is an error's machine-readable kind.
type Code string

// The codes. Most follow the status; a few name a state a client acts on.
const (
	BadRequest   Code = "bad_request"  // 400: the request is wrong; do not retry it as is
	Unauthorized Code = "unauthorized" // 401: no key, token or signature, or a wrong one
	Forbidden    Code = "forbidden"    // 403: authenticated, not allowed this
	NotFound     Code = "not_found"    // 404
	Conflict     Code = "conflict"     // 409: refused for the state (budget, balance, stock, an id reused)
	TooLarge     Code = "too_large"    // 413: the body is over the endpoint's cap
	RateLimited  Code = "rate_limited" // 429: over a rate limit; retry after Retry-After
	Overloaded   Code = "overloaded"   // 503: refused at once by admission control; retry after Retry-After
	Unavailable  Code = "unavailable"  // 503: a dependency is down or rebuilding; retry after Retry-After
	Pending      Code = "pending"      // 202: accepted, the outcome not known yet; retry with the same id
	Exhausted    Code = "exhausted"    // 503: the uin pool has nothing to hand out
	Rebuilding   Code = "rebuilding"   // 503: the uin pool is being rebuilt from uin.pool
	Internal     Code = "internal"     // 500
)

// Codes are every code, for documents that list them (the OpenAPI
// descriptions, checked against this).
var Codes = []Code{BadRequest, Unauthorized, Forbidden, NotFound, Conflict, TooLarge, RateLimited, Overloaded, Unavailable,
	Pending, Exhausted, Rebuilding, Internal}

// Body is the error body.
type Body struct {
	Error string `json:"error"`
	Code  Code   `json:"code"`
}

// ForStatus is the code a status means when nothing more precise is known.
func ForStatus(status int) Code {
	switch status {
	case http.StatusBadRequest:
		return BadRequest
	case http.StatusUnauthorized:
		return Unauthorized
	case http.StatusForbidden:
		return Forbidden
	case http.StatusNotFound:
		return NotFound
	case http.StatusConflict:
		return Conflict
	case http.StatusRequestEntityTooLarge:
		return TooLarge
	case http.StatusTooManyRequests:
		return RateLimited
	case http.StatusServiceUnavailable:
		return Unavailable
	case http.StatusAccepted:
		return Pending
	}
	return Internal
}

// Write answers status with the error body.
func Write(w http.ResponseWriter, status int, code Code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Body{Error: message, Code: code})
}
