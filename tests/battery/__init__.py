"""The bad-input battery (issue 13 section 2): every bad input is one clear error and changes nothing."""
