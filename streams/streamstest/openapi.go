package streamstest

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"surge/streams/openapi"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"go.yaml.in/yaml/v3"

	"surge/streams/httperr"
)

// CheckOpenAPI checks an API's OpenAPI document: valid OpenAPI 3 (every
// reference resolves, every schema is one; kin-openapi's validation), and
// against what the API serves: the same "METHOD /path" routes, an answer
// documented for each, and the error body with httperr's codes.
func CheckOpenAPI(t *testing.T, doc []byte, routes []string) {
	t.Helper()
	loaded, err := openapi3.NewLoader().LoadFromData(doc)
	if err != nil {
		t.Fatalf("the OpenAPI document does not load: %v", err)
	}
	if err := loaded.Validate(context.Background()); err != nil {
		t.Fatalf("the OpenAPI document is not valid OpenAPI 3: %v", err)
	}
	var d struct {
		OpenAPI    string                                                   `yaml:"openapi"`
		Paths      map[string]map[string]struct{ Responses map[string]any } `yaml:"paths"`
		Components struct {
			Schemas map[string]struct {
				Required   []string `yaml:"required"`
				Properties map[string]struct {
					Enum []string `yaml:"enum"`
				} `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(doc, &d); err != nil {
		t.Fatalf("the OpenAPI document does not parse: %v", err)
	}
	if !strings.HasPrefix(d.OpenAPI, "3.") {
		t.Fatalf("openapi: %q, want 3.x", d.OpenAPI)
	}
	var documented []string
	for path, ops := range d.Paths {
		for method, op := range ops {
			if method == "parameters" {
				continue
			}
			route := strings.ToUpper(method) + " " + path
			documented = append(documented, route)
			if len(op.Responses) == 0 {
				t.Errorf("%s: no response documented", route)
			}
			if _, ok := op.Responses["200"]; !ok {
				t.Errorf("%s: its answer (200) is not documented", route)
			}
			switch method {
			case "get", "post", "put", "delete", "patch":
			default:
				t.Errorf("%s: not an HTTP method", route)
			}
		}
	}
	slices.Sort(documented)
	served := slices.Clone(routes)
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Errorf("documented routes %v, served %v", documented, served)
	}
	errBody, ok := d.Components.Schemas["Error"]
	if !ok || !slices.Contains(errBody.Required, "error") || !slices.Contains(errBody.Required, "code") {
		t.Fatalf("no Error schema requiring error and code (streams/httperr.Body)")
	}
	var codes []string
	for _, c := range httperr.Codes {
		codes = append(codes, string(c))
	}
	if got := errBody.Properties["code"].Enum; !slices.Equal(got, codes) {
		t.Errorf("Error.code lists %v, httperr has %v", got, codes)
	}
}

// CheckOpenAPIServed asks h for its document (openapi.Route) without
// credentials, as a client generator would: it must answer the embedded
// document as YAML.
func CheckOpenAPIServed(t *testing.T, h http.Handler, doc []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", strings.TrimPrefix(openapi.Route, "GET "), nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s without credentials: %d %s", openapi.Route, rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/yaml" {
		t.Errorf("GET %s: Content-Type %q", openapi.Route, ct)
	}
	if !bytes.Equal(rec.Body.Bytes(), doc) {
		t.Errorf("GET %s answered %d bytes, not the embedded document (%d)", openapi.Route, rec.Body.Len(), len(doc))
	}
}
