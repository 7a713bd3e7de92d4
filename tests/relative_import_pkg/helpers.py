SCALE = 3.0


def shift(x):
    return x + 1
