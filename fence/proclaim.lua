-- Proclaim a new value for the leader's term, only if the term is still
-- the lock's (after elect.lua, which records and publishes it).
-- KEYS an election's six (see elect.lua); ARGV[1] the term's lock value
-- '<token>:<holder>', ARGV[2] the value.
-- Returns 1 when done, 0 when the lock is gone, or the value found when
-- another term has it: as renew.lua, so that the caller reports a loss the
-- same way.
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return 0
end
if cur ~= ARGV[1] then
  return cur
end
proclaim(cur, ARGV[2])
return 1
