#pragma once
#include "rendezvous/store.h"  // the shim declares everything in one file
