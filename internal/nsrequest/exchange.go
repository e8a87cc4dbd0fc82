package nsrequest

// The wire format of the keyless path's token exchange: the namespaces controller serves it, the
// request command (internal/nsclient) calls it.

// ExchangePath is where a job posts its identity token (Authorization: Bearer <token>).
const ExchangePath = "/v1/exchange"

// ExchangeRequest is the optional body of an exchange.
type ExchangeRequest struct {
	// TTL and TokenTTL ask for less than the rule gives (Go durations).
	TTL      string `json:"ttl,omitempty"`
	TokenTTL string `json:"tokenTTL,omitempty"`
}

// ExchangeResponse is what a successful exchange returns.
type ExchangeResponse struct {
	Namespace  string `json:"namespace"`
	Kubeconfig string `json:"kubeconfig"`
	// ExpiresAt is when the namespace is deleted (empty: never); TokenExpiresAt, when its token expires.
	ExpiresAt      string `json:"expiresAt,omitempty"`
	TokenExpiresAt string `json:"tokenExpiresAt,omitempty"`
}

// ExchangeError is what a refused exchange returns: the check that failed and why.
type ExchangeError struct {
	Check   string `json:"check"`
	Message string `json:"message"`
}
