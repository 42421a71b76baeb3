// Command benchdoc records a benchmark run in docs/benchmarks.md: it puts
// the output of one command, with the command, the date and the machine,
// between the markers <!-- bench:NAME --> and <!-- /bench:NAME --> of the
// document (a new section at the end when they are missing). The prose
// around the markers — what the figures mean, the goals, how far they are
// — stays as people wrote it. `make bench` runs it once per benchmark.
//
//	benchdoc -doc docs/benchmarks.md -name sim -title "Simulator" -cmd "spillway sim …" out.txt
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

func main() {
	doc := flag.String("doc", "docs/benchmarks.md", "the document to update")
	name := flag.String("name", "", "the block's name (letters, digits, '-')")
	title := flag.String("title", "", "the section title when the block is new")
	cmd := flag.String("cmd", "", "the command that produced the output, as people should rerun it")
	flag.Parse()
	if *name == "" || *cmd == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: benchdoc -doc FILE -name NAME [-title TITLE] -cmd COMMAND OUTPUT-FILE")
		os.Exit(2)
	}
	if err := run(*doc, *name, *title, *cmd, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "benchdoc:", err)
		os.Exit(1)
	}
}

func run(docPath, name, title, cmd, outPath string) error {
	out, err := os.ReadFile(outPath)
	if err != nil {
		return fmt.Errorf("read output: %w", err)
	}
	doc, err := os.ReadFile(docPath)
	if err != nil {
		return fmt.Errorf("read document: %w", err)
	}
	b := block(cmd, time.Now().UTC(), machine(), out)
	updated, err := replace(doc, name, title, b)
	if err != nil {
		return err
	}
	return os.WriteFile(docPath, updated, 0o644)
}

// block is what goes between the markers.
func block(cmd string, at time.Time, machine string, out []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "Latest `make bench` run: %s, %s.\n\n```\n$ %s\n", at.Format("2006-01-02 15:04 MST"), machine, cmd)
	b.Write(bytes.TrimRight(out, "\n"))
	b.WriteString("\n```\n")
	return b.Bytes()
}

// replace puts content between the markers of name, or appends a section
// titled title with them.
func replace(doc []byte, name, title string, content []byte) ([]byte, error) {
	open, shut := fmt.Sprintf("<!-- bench:%s -->", name), fmt.Sprintf("<!-- /bench:%s -->", name)
	i := bytes.Index(doc, []byte(open))
	j := bytes.Index(doc, []byte(shut))
	switch {
	case i < 0 && j < 0:
		if title == "" {
			return nil, fmt.Errorf("no %s in the document and no -title for a new section", open)
		}
		var b bytes.Buffer
		b.Write(bytes.TrimRight(doc, "\n"))
		fmt.Fprintf(&b, "\n\n## %s\n\n%s\n", title, open)
		b.Write(content)
		b.WriteString(shut + "\n")
		return b.Bytes(), nil
	case i < 0 || j < i:
		return nil, fmt.Errorf("markers %s and %s are missing or out of order", open, shut)
	}
	var b bytes.Buffer
	b.Write(doc[:i+len(open)])
	b.WriteByte('\n')
	b.Write(content)
	b.Write(doc[j:])
	return b.Bytes(), nil
}

// machine describes the host: CPU model, cores, memory, load, Go.
func machine() string {
	cpu := "unknown CPU"
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	parts := []string{fmt.Sprintf("%s × %d", cpu, runtime.NumCPU())}
	if raw, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(raw), "MemTotal: %d kB", &kb); err == nil {
			parts = append(parts, fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20)))
		}
	}
	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(raw)); len(f) > 0 {
			parts = append(parts, "load "+f[0])
		}
	}
	parts = append(parts, runtime.Version())
	return strings.Join(parts, ", ")
}
