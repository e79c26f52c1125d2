package allocation_test

import (
	"testing"

	"surge/processors/uin/allocation"
	"surge/streams/streamstest"
)

// openapi.yaml describes exactly the routes the pool serves, with the
// error body every refusal is answered with.
func TestOpenAPIMatchesTheRoutes(t *testing.T) {
	streamstest.CheckOpenAPI(t, allocation.OpenAPI, allocation.Routes())
}
