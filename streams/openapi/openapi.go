// Package openapi serves an HTTP API's OpenAPI document from the API
// itself, so a client generator or a reader finds the description that
// matches the running version (streamstest.CheckOpenAPI keeps the
// document and the routes in step).
package openapi

import (
	"net/http"
	"strconv"
)

// Route is where each API serves its document. It needs no credentials:
// it is the description of the API, the same as the repository's, and
// holds no data.
const Route = "GET /v1/openapi.yaml"

// Handler answers the document.
func Handler(doc []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.Header().Set("Content-Length", strconv.Itoa(len(doc)))
		w.Header().Set("Cache-Control", "max-age=300")
		_, _ = w.Write(doc)
	}
}
