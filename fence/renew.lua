-- Extend a lock's lease only if it is still ours.
-- KEYS[1] lock
-- ARGV[1] the lock's value '<token>:<holder>', ARGV[2] lease (ms)
-- Returns 1 when extended, 0 when the key is gone, -1 when another holder
-- has it. 0 and -1 are terminal: the lock is lost.
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return 0
end
if cur ~= ARGV[1] then
  return -1
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
