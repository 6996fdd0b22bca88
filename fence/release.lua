-- Release a lock only if it is still ours, handing it to the first live
-- waiter in the same call (after queue.lua, which defines the keys and
-- the shared functions).
-- ARGV[4] the lock's value '<token>:<holder>'
-- Returns {0} when the lock is not ours (nothing changed), else what
-- pass_on returns: {1} released, {3, value} handed over to the holder in
-- value; {2} and {4, value} the same when the notification was refused
-- (an ACL user without PUBLISH: the waiter learns of its handover at its
-- next heartbeat).
if redis.call('GET', KEYS[1]) ~= ARGV[4] then
  return {0}
end
return pass_on(ARGV[4])
