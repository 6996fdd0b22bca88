package fencelockotel

import "errors"

// ErrInvalidOption is returned by New for a bad option (a nil provider);
// the message names the option.
var ErrInvalidOption = errors.New("fencelockotel: invalid option")
