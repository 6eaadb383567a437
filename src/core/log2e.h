/*
 * log2(e) and ln 2, the constants of the base-2 recurrence (core/recurrence.h) and of the
 * vector exps' reduction x log2(e) = n + f (simd/exp_poly.h): in a header of their own,
 * with no includes, so that the kernels' files (built with ISA flags) take them without the
 * recurrence's dependencies.
 */
#ifndef FAI_CORE_LOG2E_H
#define FAI_CORE_LOG2E_H

#define FAI_LOG2E 1.4426950408889634    /* log2(e), the base-2 units of a natural logit */
#define FAI_LOG2E_F 1.4426950408889634f /* the same, rounded to float                    */
#define FAI_LN2 0.6931471805599453      /* ln 2, back to natural units                   */

#endif
