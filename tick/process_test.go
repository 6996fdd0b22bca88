package tick_test

const instanceEnv = "TICK_TEST_INSTANCE"

func instanceProcess() {}
