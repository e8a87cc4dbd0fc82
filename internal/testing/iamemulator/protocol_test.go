package iamemulator_test

import (
	"encoding/json"
	"encoding/xml"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/quartermaster-dev/quartermaster/internal/testing/iamemulator"
)

func TestGetCallerIdentity(t *testing.T) {
	e := newEnv(t, iamemulator.Options{AccountID: "111122223333"}, 1)
	out := must(sts.NewFromConfig(e.cfg).GetCallerIdentity(ctx(t), &sts.GetCallerIdentityInput{})).ok(t)
	if aws.ToString(out.Account) != "111122223333" || aws.ToString(out.Arn) != "arn:aws:iam::111122223333:user/emulator" || aws.ToString(out.UserId) == "" {
		t.Errorf("GetCallerIdentity = account %q arn %q user %q", aws.ToString(out.Account), aws.ToString(out.Arn), aws.ToString(out.UserId))
	}
	if e.emu.Calls("GetCallerIdentity") != 1 {
		t.Errorf("GetCallerIdentity calls = %d", e.emu.Calls("GetCallerIdentity"))
	}
}

type errorResponse struct {
	XMLName xml.Name `xml:"ErrorResponse"`
	Error   struct {
		Type    string `xml:"Type"`
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	} `xml:"Error"`
	RequestID string `xml:"RequestId"`
}

func postForm(t *testing.T, target string, form url.Values) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, target, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

func TestRawProtocol(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)

	status, body := postForm(t, e.url+"/", url.Values{"Action": {"FrobnicateRole"}, "Version": {"2010-05-08"}})
	var er errorResponse
	if err := xml.Unmarshal(body, &er); err != nil {
		t.Fatalf("error body is not XML: %v\n%s", err, body)
	}
	if status != http.StatusBadRequest || er.Error.Code != "InvalidAction" || er.Error.Type != "Sender" || er.RequestID == "" {
		t.Errorf("unknown action: HTTP %d %+v", status, er)
	}
	if !strings.Contains(string(body), `xmlns="https://iam.amazonaws.com/doc/2010-05-08/"`) {
		t.Errorf("error body lacks the IAM namespace: %s", body)
	}

	status, body = postForm(t, e.url+"/", url.Values{"Action": {"GetRole"}, "Version": {"2010-05-08"}, "RoleName": {"nope"}})
	if err := xml.Unmarshal(body, &er); err != nil || status != http.StatusNotFound || er.Error.Code != "NoSuchEntity" ||
		er.Error.Message != "The role with name nope cannot be found." {
		t.Errorf("GetRole missing: HTTP %d %+v (%v)", status, er, err)
	}

	status, body = postForm(t, e.url+"/", url.Values{
		"Action": {"CreateRole"}, "Version": {"2010-05-08"}, "RoleName": {"r"}, "AssumeRolePolicyDocument": {trustDoc},
		"Tags.member.1.Key": {"k"}, "Tags.member.1.Value": {"v<&>"},
	})
	if status != http.StatusOK || !strings.HasPrefix(string(body), `<CreateRoleResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><CreateRoleResult><Role>`) ||
		!strings.Contains(string(body), "<Value>v&lt;&amp;&gt;</Value>") || !strings.Contains(string(body), "<RequestId>") {
		t.Errorf("CreateRole: HTTP %d %s", status, body)
	}
}

func TestEmulatorEndpoints(t *testing.T) {
	e := newEnv(t, iamemulator.Options{}, 1)
	c := ctx(t)
	must(e.iam.CreatePolicy(c, &iam.CreatePolicyInput{PolicyName: aws.String("p"), PolicyDocument: aws.String(policyDoc)})).ok(t)
	must(e.iam.CreateRole(c, &iam.CreateRoleInput{RoleName: aws.String("r"), AssumeRolePolicyDocument: aws.String(trustDoc)})).ok(t)

	getState := func() iamemulator.State {
		req, err := http.NewRequestWithContext(c, http.MethodGet, e.url+iamemulator.StatePath, http.NoBody)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var st iamemulator.State
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := getState()
	if len(st.Policies) != 1 || st.Policies[0].Versions[0].Document != policyDoc || len(st.Roles) != 1 ||
		st.Roles[0].AssumeRolePolicyDocument != trustDoc || st.Calls["CreatePolicy"] != 1 || st.Calls["CreateRole"] != 1 || st.Total != 2 {
		t.Errorf("state = %+v", st)
	}

	if status, _ := postForm(t, e.url+iamemulator.FaultsPath, url.Values{"rate": {"1"}, "kinds": {"throttle"}}); status != http.StatusNoContent {
		t.Fatalf("POST faults: HTTP %d", status)
	}
	if st := getState(); st.FailRate != 1 || len(st.FailKinds) != 1 || st.FailKinds[0] != iamemulator.FaultThrottle {
		t.Errorf("fault settings = %v %v", st.FailRate, st.FailKinds)
	}
	if status, _ := postForm(t, e.url+iamemulator.FaultsPath, url.Values{"rate": {"2"}}); status != http.StatusBadRequest {
		t.Errorf("rate 2 accepted: HTTP %d", status)
	}

	if status, _ := postForm(t, e.url+iamemulator.ResetPath, nil); status != http.StatusNoContent {
		t.Fatalf("POST reset: HTTP %d", status)
	}
	if st := getState(); len(st.Policies) != 0 || len(st.Roles) != 0 || st.Total != 0 {
		t.Errorf("state after reset = %+v", st)
	}
	// AWS-managed policies are seeded again after a reset.
	e.emu.SetFaults(0, nil)
	must(e.iam.GetPolicy(c, &iam.GetPolicyInput{PolicyArn: aws.String(readOnlyAccess)})).ok(t)
}

func TestParseFaultKinds(t *testing.T) {
	for in, want := range map[string]string{"": "throttle,5xx", "throttle": "throttle", "5xx,throttle,5xx": "5xx,throttle"} {
		kinds, err := iamemulator.ParseFaultKinds(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		got := make([]string, len(kinds))
		for i, k := range kinds {
			got[i] = string(k)
		}
		if strings.Join(got, ",") != want {
			t.Errorf("ParseFaultKinds(%q) = %v, want %s", in, got, want)
		}
	}
	if _, err := iamemulator.ParseFaultKinds("throttle,boom"); err == nil {
		t.Error("unknown kind accepted")
	}
}
