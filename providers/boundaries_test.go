package providers

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// moduleRoot walks up from this package to the directory with go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the package")
		}
		dir = parent
	}
}

func goFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// Host keys are always verified: skipping the check is allowed in tests
// only, anywhere in the module.
func TestNoInsecureHostKeyOutsideTests(t *testing.T) {
	root := moduleRoot(t)
	for _, f := range goFiles(t, root) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "InsecureIgnoreHostKey") {
			t.Errorf("%s uses ssh.InsecureIgnoreHostKey", strings.TrimPrefix(f, root+"/"))
		}
	}
}

// providers/ never imports broker/.
func TestProvidersDoNotImportBroker(t *testing.T) {
	root := moduleRoot(t)
	const broker = "github.com/spillway-dev/spillway/broker"
	fset := token.NewFileSet()
	for _, f := range goFiles(t, filepath.Join(root, "providers")) {
		file, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if path == broker || strings.HasPrefix(path, broker+"/") {
				t.Errorf("%s imports %s", strings.TrimPrefix(f, root+"/"), path)
			}
		}
	}
}
