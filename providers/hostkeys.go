package providers

import (
	"bufio"
	"strings"

	"golang.org/x/crypto/ssh"
)

// The markers cloud-init's cc_keys_to_console module prints around the
// machine's public host keys on the serial console.
const (
	hostKeysBegin = "-----BEGIN SSH HOST KEY KEYS-----"
	hostKeysEnd   = "-----END SSH HOST KEY KEYS-----"
)

// ParseConsoleHostKeys reads the host keys from the first complete
// "BEGIN SSH HOST KEY KEYS" block that cloud-init printed to the console.
// Lines may carry a prefix ("ec2: "), as on Amazon Linux. It returns no
// keys, and no error, when the block is not (yet) there.
//
// Only the first block counts: it was printed by cloud-init during the
// first boot, before anything else on the machine ran, so a later process
// writing to the console cannot replace it.
func ParseConsoleHostKeys(console string) []ssh.PublicKey {
	var keys []ssh.PublicKey
	in := false
	sc := bufio.NewScanner(strings.NewReader(console))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, hostKeysBegin):
			in, keys = true, nil
		case strings.Contains(line, hostKeysEnd):
			if in {
				return keys
			}
		case in:
			if k := parseKeyInLine(line); k != nil {
				keys = append(keys, k)
			}
		}
	}
	return nil
}

// parseKeyInLine finds an authorized_keys style key anywhere in line.
func parseKeyInLine(line string) ssh.PublicKey {
	fields := strings.Fields(line)
	for i := range fields {
		if !strings.HasPrefix(fields[i], "ssh-") && !strings.HasPrefix(fields[i], "ecdsa-") {
			continue
		}
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(strings.Join(fields[i:], " ")))
		if err == nil {
			return k
		}
	}
	return nil
}

// ParseAuthorizedKeys reads keys in authorized_keys form, one a line, as
// pinned host keys are written in config. Blank lines and # comments are
// skipped.
func ParseAuthorizedKeys(text string) ([]ssh.PublicKey, error) {
	var keys []ssh.PublicKey
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}
