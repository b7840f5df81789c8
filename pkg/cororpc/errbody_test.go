package cororpc

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// The type hashes are MD5 of struct_pack type literals; the captured
// ServiceReady response pins the method (its literal 87 80 0c 01 for
// expected<string, ErrorCode> hashes to its head 0x1cb3cc35 minus the flag).
func TestTypeHashMatchesCapture(t *testing.T) {
	if got := typeHash("\x87\x80\x0c\x01"); got != 0x1cb3cc34 {
		t.Fatalf("typeHash(expected<string,int32>) = %#08x, want 0x1cb3cc34", got)
	}
	if got := typeHash("\xfd\x04\x04\x89\x89\xff"); got != 0x3c6d83e0 {
		t.Fatalf("typeHash(Ping request) = %#08x, want 0x3c6d83e0", got)
	}
}

func TestErrorBodyVectors(t *testing.T) {
	// Written by hand from struct_pack's rules, not by appendErrorBody.
	notReg := hex.EncodeToString([]byte(NotRegisteredMessage))
	for _, tc := range []struct {
		name    string
		errCode uint8
		hex     string
		code    Errc
		msg     string
	}{
		// Release build: hash only, 1-byte size.
		{"string release", 11, "76facf9d" + "1f" + notReg, ErrcFunctionNotRegistered, NotRegisteredMessage},
		// Debug build (as the captured master): flag, metainfo 04,
		// literal 80 0c NUL.
		{"string debug", 11, "77facf9d" + "04" + "800c00" + "1f" + notReg, ErrcFunctionNotRegistered, NotRegisteredMessage},
		// A 300-byte message needs 2-byte sizes: metainfo bits 3-4 = 1.
		{"string wide size", 10, "77facf9d" + "08" + "2c01" + strings.Repeat("61", 300), ErrcRPCThrowException, strings.Repeat("a", 300)},
		{"string debug wide size", 10, "77facf9d" + "0c" + "800c00" + "2c01" + strings.Repeat("61", 300), ErrcRPCThrowException, strings.Repeat("a", 300)},
		// err_code 255: pair<uint16, string>.
		{"pair release", 255, "4ce62b37" + "2c01" + "02" + "6869", 300, "hi"},
		{"pair debug", 255, "4de62b37" + "04" + "fd08800cff00" + "2c01" + "02" + "6869", 300, "hi"},
		{"empty message", 12, "76facf9d" + "00", ErrcProtocolError, ""},
		// Code 255 as prepare_response sends it: err_code 255, bare string.
		{"code 255 as a string", 255, "76facf9d" + "02" + "6869", 255, "hi"},
	} {
		body, _ := hex.DecodeString(tc.hex)
		code, msg, err := decodeErrorBody(tc.errCode, body)
		if err != nil || code != tc.code || msg != tc.msg {
			t.Errorf("%s: got %v %q %v, want %v %q", tc.name, code, msg, err, tc.code, tc.msg)
		}
	}
}

func TestErrorBodyEncodesAsTheCapturedMaster(t *testing.T) {
	body, errCode := appendErrorBody(nil, ErrcFunctionNotRegistered, NotRegisteredMessage)
	want := "77facf9d" + "04" + "800c00" + "1f" + hex.EncodeToString([]byte(NotRegisteredMessage))
	if errCode != 11 || hex.EncodeToString(body) != want {
		t.Fatalf("got err_code %d body %x, want 11 %s", errCode, body, want)
	}
	body, errCode = appendErrorBody(nil, 300, "hi")
	want = "4de62b37" + "04" + "fd08800cff00" + "2c01" + "02" + "6869"
	if errCode != 255 || hex.EncodeToString(body) != want {
		t.Fatalf("got err_code %d body %x, want 255 %s", errCode, body, want)
	}
}

func TestErrorBodyRoundTrip(t *testing.T) {
	for _, code := range []Errc{1, 4, 11, 14, 255, 256, 1000, 0xffff} {
		for _, n := range []int{0, 1, 255, 256, 70000} {
			msg := strings.Repeat("x", n)
			body, errCode := appendErrorBody(nil, code, msg)
			gotCode, gotMsg, err := decodeErrorBody(errCode, body)
			if err != nil || gotCode != code || gotMsg != msg {
				t.Errorf("code %d len %d: got %d len %d %v", code, n, gotCode, len(gotMsg), err)
			}
		}
	}
}

func TestErrorBodyMalformed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		errCode uint8
		hex     string
	}{
		{"empty", 11, ""},
		{"short hash", 11, "76facf"},
		{"wrong hash", 11, "00000000" + "01" + "41"},
		{"pair hash for a string", 11, "4ce62b37" + "2c01" + "02" + "6869"},
		{"no metainfo", 11, "77facf9d"},
		{"compatible bits", 11, "77facf9d" + "01" + "0000" + "00"},
		{"bad literal", 11, "77facf9d" + "04" + "800d00" + "00"},
		{"unterminated literal", 11, "77facf9d" + "04" + "800c"},
		{"no size", 11, "76facf9d"},
		{"size past end", 11, "76facf9d" + "05" + "41"},
		{"8-byte size past end", 11, "77facf9d" + "18" + "ffffffffffffffff"},
		{"pair without code", 255, "4ce62b37" + "2c"},
	} {
		body, _ := hex.DecodeString(tc.hex)
		_, _, err := decodeErrorBody(tc.errCode, body)
		if !errors.Is(err, errBadErrorBody) {
			t.Errorf("%s: err %v, want errBadErrorBody", tc.name, err)
		}
	}
}

func TestRPCErrorText(t *testing.T) {
	e := &RPCError{Code: ErrcFunctionNotRegistered, Message: NotRegisteredMessage, Function: 0x3e7ec4bb}
	want := "coro_rpc function 0x3e7ec4bb: function_not_registered (11): the rpc function not registered"
	if e.Error() != want {
		t.Errorf("got %q, want %q", e.Error(), want)
	}
	if s := Errc(300).String(); s != "errc(300)" {
		t.Errorf("user code prints %q", s)
	}
}
