// A layering fixture: elastic/ reaching down to diag/, which
// check_layering.cmake must refuse (format.layering_refuses).
#pragma once

#include "brigade/diag/report.h"
