-- Raise a name's token counter to at least ARGV[1], never lower it.
-- KEYS[1] token counter
-- ARGV[1] floor, ARGV[2] idle expiry of the counter (ms)
-- Returns the counter afterwards (as a string: exact beyond 2^31).
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if want > cur then
  cur = want
end
local s = string.format('%.0f', cur)
redis.call('SET', KEYS[1], s, 'PX', ARGV[2])
return s
