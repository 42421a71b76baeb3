package fakecloud

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/pricing"
)

// OnDemandPrice is one EC2 on-demand Linux price in the fake price list.
type OnDemandPrice struct {
	InstanceType string
	// Region is the regionCode; default the fake's region.
	Region string
	// Price per hour in USD, as the price list writes it
	// ("98.3200000000").
	Price string
}

// pricingTarget is the X-Amz-Target of the one Price List Query API call
// the fake answers (the JSON 1.1 protocol: POST /, the operation in the
// header, the input as a JSON document).
const pricingTarget = "AWSPriceListService.GetProducts"

// priceProducts are the price list's products: for every configured
// price, the plain Linux product and the siblings a loose query would
// also find (Windows, RHEL, SQL Server pre-installed, dedicated tenancy,
// a reservation's unused capacity), each with its own, higher price.
func (e *EC2) priceProducts() []map[string]any {
	var out []map[string]any
	for i, p := range e.opts.Prices {
		region := p.Region
		if region == "" {
			region = e.opts.Region
		}
		variants := []struct {
			os, tenancy, sw, capacity, operation, license, factor string
		}{
			{"Linux", "Shared", "NA", "Used", "RunInstances", "No License required", "1"},
			{"Windows", "Shared", "NA", "Used", "RunInstances:0002", "No License required", "1.18"},
			{"RHEL", "Shared", "NA", "Used", "RunInstances:0010", "No License required", "1.06"},
			{"Linux", "Shared", "SQL Std", "Used", "RunInstances:0004", "No License required", "1.31"},
			{"Linux", "Dedicated", "NA", "Used", "RunInstances", "No License required", "1.10"},
			{"Linux", "Shared", "NA", "UnusedCapacityReservation", "RunInstances", "No License required", "1"},
		}
		for j, v := range variants {
			sku := fmt.Sprintf("FAKESKU%03d%02d", i, j)
			term := sku + ".JRTCKXETXF"
			dim := term + ".6YS6EN2CT7"
			price := scalePrice(p.Price, v.factor)
			out = append(out, map[string]any{
				"product": map[string]any{
					"productFamily": "Compute Instance",
					"attributes": map[string]string{
						"servicecode": "AmazonEC2", "servicename": "Amazon Elastic Compute Cloud",
						"instanceType": p.InstanceType, "instanceFamily": "GPU instance",
						"regionCode": region, "location": regionName(region), "locationType": "AWS Region",
						"operatingSystem": v.os, "tenancy": v.tenancy, "preInstalledSw": v.sw,
						"capacitystatus": v.capacity, "operation": v.operation, "licenseModel": v.license,
						"usagetype": "BoxUsage:" + p.InstanceType, "marketoption": "OnDemand",
					},
					"sku": sku,
				},
				"serviceCode": "AmazonEC2",
				"terms": map[string]any{
					"OnDemand": map[string]any{
						term: map[string]any{
							"priceDimensions": map[string]any{
								dim: map[string]any{
									"unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": []string{},
									"rateCode":     dim,
									"description":  fmt.Sprintf("$%s per On Demand %s %s Instance Hour", price, v.os, p.InstanceType),
									"pricePerUnit": map[string]string{"USD": price},
								},
							},
							"sku": sku, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "JRTCKXETXF",
							"termAttributes": map[string]string{},
						},
					},
				},
				"version":         "20261120193412",
				"publicationDate": "2026-11-20T19:34:12Z",
			})
		}
	}
	return out
}

// scalePrice is price × factor, written with ten decimals as the price
// list does.
func scalePrice(price, factor string) string {
	p, _ := strconv.ParseFloat(price, 64)
	f, _ := strconv.ParseFloat(factor, 64)
	if factor == "1" {
		return price
	}
	return strconv.FormatFloat(p*f, 'f', 10, 64)
}

func regionName(code string) string {
	switch code {
	case "us-east-1":
		return "US East (N. Virginia)"
	case "us-west-2":
		return "US West (Oregon)"
	case "eu-central-1":
		return "EU (Frankfurt)"
	}
	return code
}

// getProducts answers GetProducts: the products of ServiceCode matching
// every filter (TERM_MATCH on an attribute), MaxResults at a time with a
// NextToken, each PriceList entry a JSON document in a string.
func (e *EC2) getProducts(w http.ResponseWriter, r *http.Request) {
	var in struct {
		ServiceCode   string
		FormatVersion string
		MaxResults    int
		NextToken     string
		Filters       []struct{ Field, Type, Value string }
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writePricingError(w, "InvalidParameterException", "bad request body: "+err.Error())
		return
	}
	if in.ServiceCode == "" {
		writePricingError(w, "InvalidParameterException", "ServiceCode is required")
		return
	}
	if in.FormatVersion != "" && in.FormatVersion != "aws_v1" {
		writePricingError(w, "InvalidParameterException", "FormatVersion must be aws_v1")
		return
	}
	var match []string
	for _, prod := range e.priceProducts() {
		attrs := prod["product"].(map[string]any)["attributes"].(map[string]string)
		if prod["serviceCode"] != in.ServiceCode {
			continue
		}
		ok := true
		for _, f := range in.Filters {
			if f.Type != "TERM_MATCH" {
				writePricingError(w, "InvalidParameterException", "the fake supports TERM_MATCH filters only, got "+f.Type)
				return
			}
			v, has := attrs[f.Field]
			if f.Field == "ServiceCode" {
				v, has = in.ServiceCode, true
			}
			if !has || !strings.EqualFold(v, f.Value) {
				ok = false
			}
		}
		if ok {
			raw, _ := json.Marshal(prod)
			match = append(match, string(raw))
		}
	}
	start := 0
	if in.NextToken != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(in.NextToken, "fake-token-"))
		if err != nil || n < 0 || n > len(match) {
			writePricingError(w, "InvalidNextTokenException", "the next token is not valid")
			return
		}
		start = n
	}
	size := in.MaxResults
	if size <= 0 || size > 100 {
		size = 100
	}
	end := min(start+size, len(match))
	out := map[string]any{"FormatVersion": "aws_v1", "PriceList": match[start:end]}
	if end < len(match) {
		out["NextToken"] = "fake-token-" + strconv.Itoa(end)
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_ = json.NewEncoder(w).Encode(out)
}

func writePricingError(w http.ResponseWriter, code, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	status := http.StatusBadRequest
	switch code {
	case "ThrottlingException":
		status = http.StatusTooManyRequests
	case "InternalErrorException":
		status = http.StatusInternalServerError
	case "AccessDeniedException":
		status = http.StatusForbidden
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": code, "Message": msg})
}

// PricingClient returns a Price List Query API client for the fake, with
// static credentials, for providers/aws.NewWithAPI.
func PricingClient(e *EC2) *pricing.Client {
	return pricing.New(pricing.Options{
		Region:       "us-east-1",
		BaseEndpoint: awssdk.String(e.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDFAKECLOUD", "fakecloud-secret", ""),
	})
}

// servePricing answers a Price List Query API call. The request must be
// signed for the pricing service (SigV4 scope .../pricing/aws4_request),
// as the real endpoint checks.
func (e *EC2) servePricing(w http.ResponseWriter, r *http.Request, target string) {
	action := strings.TrimPrefix(target, "AWSPriceListService.")
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls[action]++
	if code, ok := e.failNext[action]; ok {
		delete(e.failNext, action)
		writePricingError(w, code, "injected failure")
		return
	}
	if !strings.Contains(r.Header.Get("Authorization"), "/pricing/aws4_request") {
		writePricingError(w, "AccessDeniedException", "the request is not signed for the pricing service")
		return
	}
	if target != pricingTarget {
		writePricingError(w, "InvalidParameterException", "the fake answers "+pricingTarget+" only, not "+target)
		return
	}
	e.getProducts(w, r)
}
