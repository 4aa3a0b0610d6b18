package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"
)

// storagePayload is an event name and CloudEvents-like JSON data for the
// version-th event of stream, as an order service would append them:
// random ids (UUIDs), amounts, addresses and line items, so that
// compression meets what it would in production rather than a repeated
// or random-bytes body. Sizes run from 170 to 790 bytes, 238 on average
// over the storage row's events (an order's first event, OrderPlaced, is
// the largest).
func storagePayload(rng *rand.Rand, stream string, version int64, at time.Time) (string, []byte) {
	customer := map[string]any{
		"customerId": uuid(rng),
		"email":      fmt.Sprintf("%s.%s%d@example.%s", pick(rng, firstNames), pick(rng, lastNames), rng.IntN(1000), pick(rng, tlds)),
	}
	var name string
	data := map[string]any{"orderId": stream, "occurredAt": at.Format(time.RFC3339Nano), "schemaVersion": 3}
	switch {
	case version == 0:
		name = "OrderPlaced"
		var items []map[string]any
		var total int
		for range 1 + rng.IntN(4) {
			qty, price := 1+rng.IntN(3), 199+rng.IntN(20000)
			total += qty * price
			items = append(items, map[string]any{
				"sku": fmt.Sprintf("SKU-%06d", rng.IntN(1_000_000)), "name": pick(rng, products), "quantity": qty,
				"unitPrice": map[string]any{"amount": fmt.Sprintf("%d.%02d", price/100, price%100), "currency": "EUR"},
			})
		}
		data["customer"] = customer
		data["items"] = items
		data["total"] = map[string]any{"amount": fmt.Sprintf("%d.%02d", total/100, total%100), "currency": "EUR"}
		data["shippingAddress"] = map[string]any{
			"street": fmt.Sprintf("%d %s", 1+rng.IntN(300), pick(rng, streets)), "city": pick(rng, cities),
			"postalCode": fmt.Sprintf("%05d", rng.IntN(100000)), "country": pick(rng, countries),
		}
	case rng.IntN(4) == 0:
		name = "OrderShipped"
		data["carrier"] = pick(rng, carriers)
		data["trackingNumber"] = fmt.Sprintf("1Z%08X%08X", rng.Uint32(), rng.Uint32())
		data["estimatedDelivery"] = at.Add(time.Duration(48+rng.IntN(96)) * time.Hour).Format(time.DateOnly)
	case rng.IntN(3) == 0:
		name = "OrderPaid"
		data["paymentId"] = uuid(rng)
		data["method"] = pick(rng, methods)
		amount := 199 + rng.IntN(80000)
		data["amount"] = map[string]any{"amount": fmt.Sprintf("%d.%02d", amount/100, amount%100), "currency": "EUR"}
	default:
		name = "OrderLineChanged"
		data["sku"] = fmt.Sprintf("SKU-%06d", rng.IntN(1_000_000))
		data["quantity"] = rng.IntN(5)
		data["changedBy"] = customer
		data["reason"] = pick(rng, reasons)
	}
	b, err := json.Marshal(data)
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	return name, b
}

// uuid is a random version 4 UUID.
func uuid(rng *rand.Rand) string {
	a, b := rng.Uint64(), rng.Uint64()
	return fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x", a>>32, a>>16&0xffff, a&0xfff, 0x8000|b>>48&0x3fff, b&0xffffffffffff)
}

func pick(rng *rand.Rand, from []string) string { return from[rng.IntN(len(from))] }

var (
	firstNames = []string{"anna", "ben", "chloe", "david", "emma", "farid", "greta", "hugo", "ines", "jonas", "kim", "lena", "mehmet", "nora", "oscar", "paula"}
	lastNames  = []string{"schmidt", "martin", "rossi", "garcia", "novak", "jensen", "dubois", "kowalski", "silva", "meyer", "costa", "berg"}
	tlds       = []string{"com", "de", "fr", "org", "net", "io"}
	products   = []string{"Espresso machine", "Running shoes", "Wool scarf", "Desk lamp", "Yoga mat", "Coffee beans 1kg", "Bluetooth speaker", "Cast iron pan", "Notebook A5", "Backpack 30L"}
	streets    = []string{"Main Street", "Rue de Rivoli", "Hauptstraße", "Via Roma", "Calle Mayor", "Kings Road", "Nørregade", "Ulica Długa"}
	cities     = []string{"Berlin", "Paris", "Milan", "Madrid", "London", "Copenhagen", "Gdańsk", "Lisbon", "Vienna", "Amsterdam"}
	countries  = []string{"DE", "FR", "IT", "ES", "GB", "DK", "PL", "PT", "AT", "NL"}
	carriers   = []string{"DHL", "UPS", "DPD", "GLS", "PostNL", "La Poste"}
	methods    = []string{"card", "sepa_debit", "paypal", "klarna", "apple_pay"}
	reasons    = []string{"customer_request", "out_of_stock", "price_adjustment", "duplicate_line"}
)
