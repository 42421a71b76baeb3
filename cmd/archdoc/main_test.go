package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const module = "example.com/m"

func TestParseListKeepsModulePackages(t *testing.T) {
	g := parseList(module, "example.com/m/a example.com/m/b fmt example.com/m/b\nexample.com/m/b\n")
	if len(g) != 2 || strings.Join(g["a"], ",") != "b" || len(g["b"]) != 0 {
		t.Fatalf("graph: %v", g)
	}
}

func TestReduceDropsImpliedArrows(t *testing.T) {
	red := reduce(map[string][]string{"a": {"b", "c"}, "b": {"c"}, "c": {}})
	if strings.Join(red["a"], ",") != "b" || strings.Join(red["b"], ",") != "c" {
		t.Fatalf("reduced: %v", red)
	}
}

// TestCheckNamesMissingPackage: a document whose block lacks a package
// fails the check, naming it; after -write it passes.
func TestCheckNamesMissingPackage(t *testing.T) {
	g := map[string][]string{"a": {"b"}, "b": {}}
	doc := "# Arch\n\n" + begin + "\n" + render(module, map[string][]string{"a": {}}) + end + "\n\nprose\n"
	err := compare("arch.md", []byte(doc), g, render(module, g))
	if err == nil || !strings.Contains(err.Error(), "misses b") {
		t.Fatalf("check: %v", err)
	}
	fixed, err := replace([]byte(doc), render(module, g))
	if err != nil {
		t.Fatal(err)
	}
	if err := compare("arch.md", fixed, g, render(module, g)); err != nil {
		t.Fatalf("after write: %v", err)
	}
	if !strings.HasSuffix(string(fixed), end+"\n\nprose\n") || !strings.Contains(string(fixed), "p0 --> p1") {
		t.Fatalf("written:\n%s", fixed)
	}
}

// TestArchitectureDocCurrent: docs/architecture.md lists every package of
// the module with its imports (what make check runs).
func TestArchitectureDocCurrent(t *testing.T) {
	doc := filepath.Join("..", "..", "docs", "architecture.md")
	if _, err := os.Stat(doc); err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Join("..", ".."))
	if err := run(filepath.Join("docs", "architecture.md"), false); err != nil {
		t.Fatal(err)
	}
}
