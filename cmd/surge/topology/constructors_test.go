package topology_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// constructed are the packages of surge's processors (and the intake and
// reconciler they run), relative to the module root.
var constructed = []string{
	"processors/push/presence",
	"processors/push/planner", "processors/push/executor", "processors/push/offline", "processors/push/ctr",
	"processors/timer",
	"processors/uin/tracker", "processors/uin/recycle", "processors/uin/allocation", "processors/uin/restore",
	"processors/wallet/grant", "processors/wallet/ledger", "processors/wallet/api", "processors/wallet/identity",
	"sinks/recon",
}

// Every processor is built one way: a Config that embeds streams.Env, its
// defaults filled by (*Config).EnsureDefaults, and New(cfg Config) as the
// only constructor of the processor.
func TestProcessorsShareOneConstructorStyle(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	for _, dir := range constructed {
		t.Run(dir, func(t *testing.T) {
			fset := token.NewFileSet()
			pkgs, err := parser.ParseDir(fset, filepath.Join(root, dir), func(fi os.FileInfo) bool {
				return !strings.HasSuffix(fi.Name(), "_test.go")
			}, 0)
			if err != nil {
				t.Fatal(err)
			}
			var embedsEnv, ensure, newOK bool
			for _, pkg := range pkgs {
				for _, f := range pkg.Files {
					for _, d := range f.Decls {
						switch d := d.(type) {
						case *ast.GenDecl:
							for _, sp := range d.Specs {
								ts, ok := sp.(*ast.TypeSpec)
								if !ok || ts.Name.Name != "Config" {
									continue
								}
								st, ok := ts.Type.(*ast.StructType)
								if !ok {
									t.Fatalf("Config is not a struct")
								}
								for _, fld := range st.Fields.List {
									if sel, ok := fld.Type.(*ast.SelectorExpr); ok && len(fld.Names) == 0 &&
										sel.Sel.Name == "Env" && sel.X.(*ast.Ident).Name == "streams" {
										embedsEnv = true
									}
								}
							}
						case *ast.FuncDecl:
							switch {
							case d.Recv != nil && d.Name.Name == "EnsureDefaults":
								if star, ok := d.Recv.List[0].Type.(*ast.StarExpr); ok && star.X.(*ast.Ident).Name == "Config" {
									ensure = true
								}
							case d.Recv == nil && d.Name.Name == "New":
								ps := d.Type.Params.List
								if len(ps) != 1 || len(ps[0].Names) != 1 || ps[0].Type.(*ast.Ident).Name != "Config" {
									t.Errorf("New takes %d parameter groups; want New(cfg Config)", len(ps))
								}
								newOK = true
							case d.Recv == nil && strings.HasPrefix(d.Name.Name, "New") && d.Type.Results != nil:
								// Other constructors build helpers, never the processor
								// built by New.
								for _, r := range d.Type.Results.List {
									if star, ok := r.Type.(*ast.StarExpr); ok {
										if id, ok := star.X.(*ast.Ident); ok && newReturns(pkgs, id.Name) {
											t.Errorf("%s builds the processor too; New(Config) is its one constructor", d.Name.Name)
										}
									}
								}
							}
						}
					}
				}
			}
			if !embedsEnv {
				t.Error("Config does not embed streams.Env")
			}
			if !ensure {
				t.Error("no (*Config).EnsureDefaults")
			}
			if !newOK {
				t.Error("no New(cfg Config)")
			}
		})
	}
}

// newReturns reports whether the package's New returns *name.
func newReturns(pkgs map[string]*ast.Package, name string) bool {
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == "New" && fd.Type.Results != nil {
					if star, ok := fd.Type.Results.List[0].Type.(*ast.StarExpr); ok {
						if id, ok := star.X.(*ast.Ident); ok && id.Name == name {
							return true
						}
					}
				}
			}
		}
	}
	return false
}
