package sqlfence

// SendLiterals makes s send its own statements with their values written
// in, as it does over lib/pq (literal.go), whatever its driver: the tests
// run that path over pgx's driver.
func SendLiterals(s *Store) { s.literal = true }
