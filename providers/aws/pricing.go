package aws

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/pricing"
	pricingtypes "github.com/aws/aws-sdk-go-v2/service/pricing/types"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/providers"
)

// PricingAPI is the part of the AWS Price List Query API client this
// package uses; *pricing.Client implements it. The broker calls it only
// when an operator runs `spillway offers refresh`.
type PricingAPI interface {
	GetProducts(ctx context.Context, in *pricing.GetProductsInput, optFns ...func(*pricing.Options)) (*pricing.GetProductsOutput, error)
}

// DefaultPricingRegion is where the Price List Query API is served from
// (api.pricing.us-east-1.amazonaws.com); it answers for every region.
const DefaultPricingRegion = "us-east-1"

// priceFilters select the one product of an instance type that is the
// plain on-demand Linux machine: shared tenancy, no pre-installed
// software, capacity status Used (not a reservation's unused box).
func (p *Provider) priceFilters(instanceType string) []pricingtypes.Filter {
	f := func(field, value string) pricingtypes.Filter {
		return pricingtypes.Filter{Type: pricingtypes.FilterTypeTermMatch, Field: awssdk.String(field), Value: awssdk.String(value)}
	}
	return []pricingtypes.Filter{
		f("instanceType", instanceType),
		f("regionCode", p.cfg.Region),
		f("operatingSystem", "Linux"),
		f("tenancy", "Shared"),
		f("preInstalledSw", "NA"),
		f("capacitystatus", "Used"),
	}
}

// FetchPrices reads the on-demand price of every configured instance type
// in the provider's region from the Price List Query API (GetProducts,
// one query per type). A type the price list does not know is listed in
// Missing and keeps its configured price. The caller stamps FetchedAt.
func (p *Provider) FetchPrices(ctx context.Context) (providers.PriceTable, error) {
	t := providers.PriceTable{Provider: p.cfg.Name, Region: p.cfg.Region, Currency: p.cfg.Currency,
		OnDemand: map[string]billing.Amount{}}
	if p.pricing == nil {
		return t, providers.NewError(providers.ErrUnsupported, providerKind, "get products", "", fmt.Errorf("provider %s has no price list client", p.cfg.Name))
	}
	seen := map[string]bool{}
	for _, it := range p.cfg.InstanceTypes {
		if seen[it.Name] {
			continue
		}
		seen[it.Name] = true
		in := &pricing.GetProductsInput{ServiceCode: awssdk.String("AmazonEC2"), FormatVersion: awssdk.String("aws_v1"),
			Filters: p.priceFilters(it.Name), MaxResults: awssdk.Int32(100)}
		var docs []string
		pages := pricing.NewGetProductsPaginator(p.pricing, in)
		for pages.HasMorePages() {
			out, err := pages.NextPage(ctx)
			if err != nil {
				return t, mapError("get products", err)
			}
			docs = append(docs, out.PriceList...)
		}
		price, ok, err := onDemandPrice(docs, it.Name, p.cfg.Region, p.cfg.Currency)
		if err != nil {
			return t, providers.NewError(providers.ErrUnavailable, providerKind, "get products", "", err)
		}
		if !ok {
			t.Missing = append(t.Missing, it.Name)
			continue
		}
		t.OnDemand[it.Name] = price
	}
	return t, nil
}

// UsePrices makes Offers price on-demand offers from t where it has a
// price for the type (an empty table: the configured prices again); a
// table of another provider is ignored.
func (p *Provider) UsePrices(t providers.PriceTable) {
	if t.Provider != p.cfg.Name || (t.Currency != "" && t.Currency != p.cfg.Currency) {
		return
	}
	t.OnDemand = maps.Clone(t.OnDemand)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prices = &t
}

// priceListProduct is the part of one PriceList entry (format aws_v1) read
// here: the product's attributes and its on-demand terms.
type priceListProduct struct {
	Product struct {
		SKU        string            `json:"sku"`
		Attributes map[string]string `json:"attributes"`
	} `json:"product"`
	Terms struct {
		OnDemand map[string]struct {
			PriceDimensions map[string]struct {
				Unit         string            `json:"unit"`
				PricePerUnit map[string]string `json:"pricePerUnit"`
			} `json:"priceDimensions"`
		} `json:"OnDemand"`
	} `json:"terms"`
}

// onDemandPrice finds the hourly on-demand price of instanceType in region
// among the PriceList documents: the product whose attributes match (the
// filters again, so an endpoint that filters loosely cannot slip another
// product in) and whose operation is plain RunInstances (Linux), its
// OnDemand term's hourly dimension in currency. ok is false when no
// product matches; two matching products with different prices are an
// error rather than a guess.
func onDemandPrice(docs []string, instanceType, region, currency string) (price billing.Amount, ok bool, err error) {
	want := map[string]string{"instanceType": instanceType, "regionCode": region, "operatingSystem": "Linux",
		"tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}
	var sku string
	for i, doc := range docs {
		var prod priceListProduct
		if err := json.Unmarshal([]byte(doc), &prod); err != nil {
			return 0, false, fmt.Errorf("price list entry %d for %s: %w", i, instanceType, err)
		}
		a := prod.Product.Attributes
		match := true
		for k, v := range want {
			if a[k] != v {
				match = false
			}
		}
		if op, has := a["operation"]; has && op != "RunInstances" {
			match = false
		}
		if !match {
			continue
		}
		for _, code := range slices.Sorted(maps.Keys(prod.Terms.OnDemand)) {
			term := prod.Terms.OnDemand[code]
			for _, dk := range slices.Sorted(maps.Keys(term.PriceDimensions)) {
				d := term.PriceDimensions[dk]
				if !strings.EqualFold(d.Unit, "Hrs") {
					continue
				}
				raw, has := d.PricePerUnit[currency]
				if !has {
					return 0, false, fmt.Errorf("price list: %s (sku %s) has no %s price", instanceType, prod.Product.SKU, currency)
				}
				v, err := parsePriceListAmount(raw)
				if err != nil {
					return 0, false, fmt.Errorf("price list: %s (sku %s): pricePerUnit.%s: %w", instanceType, prod.Product.SKU, currency, err)
				}
				if v <= 0 {
					continue // a free or placeholder dimension
				}
				if ok && v != price {
					return 0, false, fmt.Errorf("price list: %s has two on-demand Linux prices in %s: %s (sku %s) and %s (sku %s)",
						instanceType, region, price, sku, v, prod.Product.SKU)
				}
				price, ok, sku = v, true, prod.Product.SKU
			}
		}
	}
	return price, ok, nil
}

// parsePriceListAmount reads a price list amount ("98.3200000000"),
// rounded half up to the micro billing counts in.
func parsePriceListAmount(s string) (billing.Amount, error) {
	if a, err := billing.ParseAmount(s); err == nil {
		if a < 0 {
			return 0, fmt.Errorf("%q is negative", s)
		}
		return a, nil
	}
	r, ok := new(big.Rat).SetString(strings.TrimSpace(s))
	if !ok || strings.ContainsAny(s, "eE/") || r.Sign() < 0 {
		return 0, fmt.Errorf("%q is not a decimal amount", s)
	}
	r.Mul(r, big.NewRat(billing.MicrosPerUnit, 1))
	r.Add(r, big.NewRat(1, 2))
	n := new(big.Int).Quo(r.Num(), r.Denom())
	if !n.IsInt64() {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return billing.Amount(n.Int64()), nil
}

// tablePrice is t's price of instanceType; false without a table or a
// price for the type.
func tablePrice(t *providers.PriceTable, instanceType string) (billing.Amount, bool) {
	if t == nil {
		return 0, false
	}
	v, ok := t.OnDemand[instanceType]
	return v, ok && v > 0
}
