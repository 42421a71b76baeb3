package broker

import (
	"slices"
	"strings"
	"testing"
)

func TestParseArray(t *testing.T) {
	good := map[string][]int{
		"0-4":        {0, 1, 2, 3, 4},
		"7":          {7},
		"1,3,5-7":    {1, 3, 5, 6, 7},
		"0-15:4":     {0, 4, 8, 12},
		"5-6,0-1,5":  {0, 1, 5, 6},
		" 2 , 0-1 ":  {0, 1, 2},
		"0-9999":     nil, // checked by length below
		"999999-999": nil,
	}
	for in, want := range good {
		got, limit, err := ParseArray(in)
		if limit != 0 {
			t.Fatalf("%q: limit %d", in, limit)
		}
		switch {
		case in == "0-9999":
			if err != nil || len(got) != MaxArraySize || got[0] != 0 || got[len(got)-1] != 9999 {
				t.Fatalf("%q: %d elements, %v", in, len(got), err)
			}
		case in == "999999-999":
			if err == nil {
				t.Fatalf("%q: accepted a range going down", in)
			}
		case err != nil || !slices.Equal(got, want):
			t.Fatalf("%q: %v, %v; want %v", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":                  "empty",
		"9-1":               "must go up",
		"a":                 "whole numbers",
		"1-":                "whole numbers",
		"0-10000":           "more than 10000",
		"1:2":               "needs a range",
		"0-9:0":             "step",
		"0-9:x":             "step",
		"-1":                "whole numbers",
		"1000001":           "whole numbers",
		"0-5,,7":            "whole numbers",
		"0-1\x00":           "whole numbers",
		"0-4999,5000-10000": "more than 10000",
		"0-9%0":             "from 1 to 10000",
		"0-9%":              "from 1 to 10000",
		"0-9%x":             "from 1 to 10000",
		"0-9%-2":            "from 1 to 10000",
		"0-9%+2":            "from 1 to 10000",
		"0-9%10001":         "from 1 to 10000",
		"0-9%2%3":           "from 1 to 10000",
		"%4":                "empty",
	}
	for in, want := range bad {
		_, _, err := ParseArray(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%q: error %v, want one saying %q", in, err, want)
		}
	}
}

func TestParseArrayLimit(t *testing.T) {
	idx, limit, err := ParseArray("0-999%10")
	if err != nil || len(idx) != 1000 || limit != 10 {
		t.Fatalf("0-999%%10: %d indexes, limit %d, %v", len(idx), limit, err)
	}
	idx, limit, err = ParseArray("1,3,5-7%1")
	if err != nil || !slices.Equal(idx, []int{1, 3, 5, 6, 7}) || limit != 1 {
		t.Fatalf("1,3,5-7%%1: %v, limit %d, %v", idx, limit, err)
	}
}
