/* A call chain with functions inlined twice deep, for the source-line tests (gcc -g -O2). */
#include <stdio.h>
#include <stdlib.h>

static int counter;

static inline __attribute__((always_inline)) int leaf_add(int x)
{
	counter += x;
	if (counter > 1000)
		abort();
	return counter * 3;
}

static inline __attribute__((always_inline)) int middle(int x)
{
	int r = leaf_add(x + 1);
	return r + leaf_add(x * 2);
}

__attribute__((noinline)) int bottom(int x)
{
	if (x < 0)
		abort();
	return middle(x) + 1;
}

__attribute__((noinline)) int callee(int x)
{
	int v = bottom(x);
	printf("%d\n", v);
	return v + bottom(v & 7);
}

__attribute__((noinline)) int caller(int x)
{
	return callee(x) + 2;
}

int main(int argc, char **argv)
{
	(void)argv;
	return caller(argc);
}
